"""pi0.5 policy: config, stateless model stages, checkpoint I/O and the adapter (see adapter.py)."""
from .adapter import Pi05Inputs, Pi05Adapter, PromptTruncatedWarning
from .checkpoint import CheckpointError, load_pi05_checkpoint, make_random_checkpoint, make_random_model
from .config import Pi05Config
from .modeling import Pi05Model, SuffixContext

__all__ = ["Pi05Config", "Pi05Model", "SuffixContext", "Pi05Adapter", "Pi05Inputs", "PromptTruncatedWarning",
           "CheckpointError", "load_pi05_checkpoint", "make_random_checkpoint", "make_random_model"]
