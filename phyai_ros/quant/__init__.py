"""Offline quantization of pi-family checkpoints (``python -m phyai_ros.quant``) and their loading.

The weight type and the ops live in ``phyai_ros.layers`` (quantized.py, quant_dispatch.py); this package owns
which weights of a model are quantized (its parts), the calibration of static activation scales, and the
quantized checkpoint folder (weights + scales + a manifest), which the family loaders read like any other.
"""
from phyai_ros.layers.quantized import QuantizedWeight, QuantScheme

from .checkpoint import MANIFEST, read_manifest, write_quantized_checkpoint
from .model import DEFAULT_PARTS, PARTS, quantize_model

__all__ = ["QuantScheme", "QuantizedWeight", "MANIFEST", "read_manifest", "write_quantized_checkpoint",
           "DEFAULT_PARTS", "PARTS", "quantize_model"]
