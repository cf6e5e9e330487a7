"""Cosmos3 Nano Policy (a world-action model: video and action latents denoised together by a mixture-of-
transformers, UniPC, classifier-free guidance) from diffusers 0.42.1's Cosmos3OmniPipeline folder layout.
See adapter.py for the policy API, stages.py for the inference stages, parallel.py for CFG / tensor parallel."""
from .adapter import Cosmos3Adapter
from .checkpoint import Cosmos3Checkpoint, load_cosmos3_checkpoint, write_random_checkpoint
from .config import FULL_TRANSFORMER, FULL_VAE, Cosmos3Settings, TransformerConfig, VaeConfig
from .parallel import Parallel
from .stages import Cosmos3Inputs, Cosmos3Stages

__all__ = ["Cosmos3Adapter", "Cosmos3Settings", "Cosmos3Inputs", "Cosmos3Stages", "Cosmos3Checkpoint",
           "load_cosmos3_checkpoint", "write_random_checkpoint", "TransformerConfig", "VaeConfig", "FULL_TRANSFORMER",
           "FULL_VAE", "Parallel"]
