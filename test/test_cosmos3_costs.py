"""Cosmos3's stage costs (models/cosmos3/costs.py): a tiny config worked out by hand, the full size's FLOPs as the
H200 benchmark reported them (docs/device_runs/2026-12-01-cosmos3/bench_cosmos3.json), and the weight bytes
against what the loader keeps."""
import pytest

from fixture_sets import cosmos3_fixture_dir
from phyai_ros.models.cosmos3.config import FULL_TRANSFORMER, TransformerConfig
from phyai_ros.models.cosmos3.costs import cosmos3_stage_costs

# width 8, 2 heads of 8 (q 16), 1 KV head (kv 8), MLP 16 (silu: gate, up, down), 2 layers
TINY = TransformerConfig(hidden_size=8, head_dim=8, num_heads=2, num_kv_heads=1, intermediate_size=16, num_layers=2,
                         rope_axes_dim=(2, 1, 1), vocab_size=16)


def test_tiny_config_by_hand():
    c = cosmos3_stage_costs(TINY, rows=2, text=3, gen=4, steps=2)
    # Per layer: projections 8 * (16 + 2 * 8) + 16 * 8 = 384 weights, MLP 3 * 8 * 16 = 384. Conditioning: two
    # layers' projections and the first's MLP, 1152 weights; FLOPs 2 * 2 rows * 3 tokens * 1152 + causal attention
    # 2 * 2 * 3 * 3 * 16 of the first layer = 14400; bytes 2 * 1152 + the embeddings 2 * 3 * 8 * 2 B = 96 + the
    # keys / values 2 * 3 * 2 layers * 2 * 8 * 2 B = 384.
    assert (c["conditioning"].flops, c["conditioning"].bytes) == (14400, 2304 + 96 + 384)
    # Per step: 2 * 2 rows * 4 tokens * 2 layers * 768 = 24576 + attention over 3 + 4 keys 4 * 2 * 4 * 7 * 16 * 2
    # = 7168; bytes: 2 layers * 768 * 2 B = 3072, the text keys / values 384, hidden states in and out
    # 2 * 2 * 4 * 8 * 2 B = 256. Two steps.
    assert (c["generation"].flops, c["generation"].bytes) == (2 * 31744, 2 * (3072 + 384 + 256))


def test_full_size_flops_as_the_h200_run_reported():
    """pi0.5-style CFG batch of two rows, 448 padded text tokens, 4 steps; 3510 vision + 32 action tokens for a
    480x832 image, 540 + 32 for a 180x320 one."""
    for gen, tflop in ((3542, 460.316410380288), (572, 66.320678780928)):
        c = cosmos3_stage_costs(FULL_TRANSFORMER, rows=2, text=448, gen=gen, steps=4)
        assert c["conditioning"].flops / 1e12 == 12.29132398592
        assert c["generation"].flops / 1e12 == tflop
        # per step the generation pathway's layer weights (6.95 B parameters in bf16, 13.9 GB) and little else
        assert 4 * 13.89e9 < c["generation"].bytes < 4 * 14.2e9


def test_weight_bytes_are_those_the_loaded_checkpoint_holds():
    """The costs' weight bytes against the weights the loader really keeps (the tiny parity fixture, fp32): each
    step reads every layer's generation-pathway matrices, the conditioning the text pathway's up to the last
    layer's keys / values (its MLP unused). With no tokens the costs are the weights alone."""
    folder = cosmos3_fixture_dir() / "pipeline"
    if not folder.is_dir():
        pytest.skip(f"no Cosmos3 fixture at {folder}")
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    stages = Cosmos3Adapter.from_files(folder).stages
    w, cfg = stages.w, stages.cfg
    layers = range(cfg.num_layers)

    def nbytes(path, names, which):
        return sum(w[f"layers.{i}.{path}.{n}"].numel() * w[f"layers.{i}.{path}.{n}"].element_size()
                   for i in which for n in names)
    gen = nbytes("gen", ("qkv", "out", "up", "down"), layers)
    text = nbytes("und", ("qkv", "out"), layers) + nbytes("und", ("up", "down"), layers[:-1])
    c = cosmos3_stage_costs(cfg, rows=1, text=0, gen=0, steps=1, weight_bytes=w["layers.0.gen.qkv"].element_size())
    assert c["generation"].bytes == gen and c["conditioning"].bytes == text
