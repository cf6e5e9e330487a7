"""GR00T N1.7 policy (LeRobot 0.6.1 checkpoints): checkpoint loading, processor, stateless Qwen3-VL backbone
and flow-matching action head, native RTC and action decoding (see adapter.py)."""
from .adapter import GrootAdapter, GrootRtc
from .checkpoint import CheckpointError, GrootCheckpoint, load_groot_checkpoint
from .config import GrootConfig
from .processor import GrootInputs, GrootProcessor

__all__ = ["GrootAdapter", "GrootRtc", "GrootInputs", "GrootProcessor", "GrootConfig", "GrootCheckpoint",
           "load_groot_checkpoint", "CheckpointError"]
