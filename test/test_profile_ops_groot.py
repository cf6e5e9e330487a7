"""scripts/profile_ops.py --groot: GR00T N1.7's (op, shape) calls are recorded from its own runner (CPU, the parity
fixture's checkpoint), so a device profile can hold its DiT's shapes beside the pi family's."""
import sys

import torch

from fixture_sets import require_groot_fixture
from ros_helpers import REPO

sys.path.insert(0, str(REPO / "scripts"))
import profile_ops  # noqa: E402

sys.path.pop(0)


def test_groot_calls_cover_backbone_context_and_loop():
    from phyai_ros.models.groot_n17 import GrootAdapter
    folder = require_groot_fixture() / "checkpoint"
    cfg = GrootAdapter.from_files(folder).config
    rec = profile_ops.record_groot_calls(folder, 2, device="cpu", dtype=torch.float32)
    ops = {op for op, _ in rec}
    # backbone (Qwen RMSNorm, its fused q/k norm + mRoPE), VL adapter and DiT (LayerNorms, GELU MLP, attention)
    assert {"rms_norm", "qkv_norm_rope", "layer_norm", "linear_gelu_tanh", "linear_add_layer_norm",
            "attention", "linear"} <= ops
    # the DiT's rows: the state token and the horizon's actions per batch item, batch 2 as asked
    rows = 1 + cfg.head.action_horizon
    dit = [key for op, key in rec if op == "linear_add_layer_norm" and key.startswith(f"2x{rows}x")]
    assert dit, sorted(k for o, k in rec if o == "linear_add_layer_norm")
    # once as chosen and once with every op on its reference: the fused ops' sub-ops are recorded too
    args, _ = rec[("linear_add_layer_norm", dit[0])]
    assert args[1].shape[:2] == (2, rows)
