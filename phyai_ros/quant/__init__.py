"""The offline quantizer (``python -m phyai_ros.quant``): checkpoint in, quantized checkpoint out, for any family
whose adapter has a ``quantize`` hook (phyai_ros/models/contract.py).

The weight type and the ops live in ``phyai_ros.layers`` (quantized.py, quant_dispatch.py); the folder format and
the parts vocabulary in ``phyai_ros.models.quantized_checkpoint``; which weights of a model are quantized, and
its folder, in each family's folder. This package is the tool: its arguments, and the calibration inputs.
"""
