"""pi0 architecture config: the pi0.5 sizes (same PaliGemma + expert geometry) with pi0's 48-token budget.

Why reuse Pi05Config: the two share every size; pi0 differs in how the expert is conditioned (state token
and action+time MLP instead of adaRMS), which lives in modeling.py, not in the sizes.
"""
from __future__ import annotations

from dataclasses import dataclass

from phyai_ros.models.pi05.config import Pi05Config


@dataclass(frozen=True)
class Pi0Config(Pi05Config):
    token_budget: int = 48

    def to_model_dims(self) -> dict:
        d = super().to_model_dims()
        d["policy_type"] = "pi0"
        d["expert"].update(use_adarms=False, adarms_cond_dim=None)
        return d
