"""pi0 architecture config: the pi family's sizes (same PaliGemma + expert geometry) with pi0's 48-token budget.

Why the shared PiConfig: pi0 and pi0.5 share every size; pi0 differs in how the expert is conditioned (state token
and action+time MLP instead of adaRMS), which lives in modeling.py, not in the sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

from phyai_ros.models.pi.config import PiConfig


@dataclass(frozen=True)
class Pi0Config(PiConfig):
    token_budget: int = 48

    def to_model_dims(self) -> dict:
        d = super().to_model_dims()
        d["policy_type"] = "pi0"
        d["expert"].update(use_adarms=False, adarms_cond_dim=None)
        return d
