"""pi0 policy: config, stateless model stages, checkpoint I/O and the adapter (API as pi0.5)."""
from .adapter import Pi0Adapter, PromptTruncatedWarning
from .checkpoint import CheckpointError, load_pi0_checkpoint, make_random_checkpoint
from .config import Pi0Config
from .modeling import Pi0Model

__all__ = ["Pi0Config", "Pi0Model", "Pi0Adapter", "PromptTruncatedWarning",
           "CheckpointError", "load_pi0_checkpoint", "make_random_checkpoint"]
