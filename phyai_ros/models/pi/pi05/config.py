"""pi0.5 architecture config: the pi family's sizes as they are (see models/pi/pi_config.py)."""
from __future__ import annotations

from dataclasses import dataclass

from phyai_ros.models.pi.config import PiConfig


@dataclass(frozen=True)
class Pi05Config(PiConfig):
    pass
