"""Cosmos3's parallel degrees on the CPU: CFG-parallel, tensor-parallel and both, as 2 and 4 processes
(torch.multiprocessing spawn, gloo over loopback), against one process running the same checkpoint.

What must hold: every rank ends with bitwise the same actions and video latents (they apply the same guidance
and UniPC step to the same gathered velocities), and those equal one process's within fp32 reduction-order
noise. Bound: max-abs <= 1e-5 x max(1, max |output|), ~80 float32 ulps of the output's magnitude; measured
here <= 1.6e-6 x (1.98e-5 on latents of magnitude 12.6 at guidance 3, 3 steps). Where the order changes: TP
sums head / column partials across ranks; CFG-parallel runs each pass alone, while one process batches both
passes with the shorter prompt's text keys padded and masked (other GEMM / attention blockings); guidance
(g = 3) then amplifies velocity differences by up to 2g - 1.

Checkpoints: a tiny random one written here (silu MLP, text q/k norms, 8 heads / 4 KV heads: TP up to 4), and
the parity fixtures' (relu2, the extra text-key norm, 4 / 2 heads: TP 2) when present.
"""
import os
import socket
import time

import pytest
import torch

from fixture_sets import cosmos3_fixture_dir

BOUND = 1e-5         # relative to the output's magnitude: max-abs <= BOUND * max(1, max |one process|)
FIX = cosmos3_fixture_dir() / "pipeline"
TASKS = ["put the carrot on the plate", "open the top drawer and take out the red cup"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(guidance=3.0):
    from phyai_ros.models.cosmos3 import Cosmos3Settings
    return Cosmos3Settings(num_steps=3, guidance=guidance, chunk_size=4, fps=15.0, resolution_tier=256,
                           view_point="wrist_view", domain="droid_lerobot", negative_prompt="blurry")


def _inputs(policy, batch):
    import numpy as np
    rng = np.random.default_rng(3)
    images = {"image": rng.integers(0, 256, (batch, 80, 112, 3), dtype=np.uint8)}
    x = policy.prepare(images, TASKS[:batch])
    return x, policy.make_noise(x, torch.Generator().manual_seed(11))


def _run(ckpt, batch, parallel=None, guidance=3.0):
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    from phyai_ros.models.cosmos3.parallel import SINGLE
    pol = Cosmos3Adapter.from_files(ckpt, settings=_settings(guidance), parallel=parallel or SINGLE)
    x, noise = _inputs(pol, batch)
    trace = {}
    actions = pol.sample_actions(x, noise, trace)
    return actions, trace["final_vision_latents"]


def _rank(rank, world, port, ckpt, cfg, tp, batch, out_dir):
    """One spawned rank: join the gloo world, run, save its result."""
    import torch.distributed as dist

    from phyai_ros.models.cosmos3.parallel import Parallel
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        actions, vision = _run(ckpt, batch, Parallel.from_world(cfg, tp))
        torch.save({"actions": actions, "vision": vision}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()


def _spawn(ckpt, cfg, tp, batch, tmp_path, timeout=300.0):
    import torch.multiprocessing as mp
    world = cfg * tp
    ctx = mp.start_processes(_rank, args=(world, _free_port(), str(ckpt), cfg, tp, batch, str(tmp_path)),
                             nprocs=world, join=False, start_method="spawn")
    deadline = time.monotonic() + timeout
    try:
        while not ctx.join(timeout=max(0.1, deadline - time.monotonic())):
            if time.monotonic() > deadline:
                raise TimeoutError(f"cfg {cfg} x tp {tp} ranks did not finish in {timeout} s")
    finally:
        for p in ctx.processes:
            if p.is_alive():
                p.terminate()
    return [torch.load(tmp_path / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def random_ckpt(tmp_path_factory):
    from phyai_ros.models.cosmos3 import TransformerConfig, VaeConfig, write_random_checkpoint
    t = TransformerConfig(hidden_size=64, head_dim=16, num_heads=8, num_kv_heads=4, intermediate_size=128,
                          num_layers=2, hidden_act="silu", qk_norm_for_text=True, rope_axes_dim=(4, 2, 2),
                          action_dim=12, vocab_size=272)
    v = VaeConfig(base_dim=8, z_dim=48, dim_mult=(1, 1, 1, 1), num_res_blocks=1, latents_mean=(0.1,) * 48,
                  latents_std=(0.9,) * 48)
    return write_random_checkpoint(tmp_path_factory.mktemp("cosmos3_tp") / "pipeline", t, v, seed=5, std=0.3)


def _check(results, ref):
    actions, vision = ref
    for r, res in enumerate(results):
        assert torch.equal(res["actions"], results[0]["actions"]), f"rank {r} differs from rank 0"
        assert torch.equal(res["vision"], results[0]["vision"]), f"rank {r} differs from rank 0"
    for name, ours, one in (("actions", results[0]["actions"], actions), ("vision", results[0]["vision"], vision)):
        scale = max(1.0, one.abs().max().item())
        assert one.abs().max().item() > 1e-2                  # a non-trivial chunk
        dev = (ours - one).abs().max().item()
        assert dev <= BOUND * scale, f"{name}: {dev:.2e} vs one process (bound {BOUND * scale:.2e})"


@pytest.mark.parametrize("cfg,tp,batch", [(2, 1, 1), (1, 2, 1), (2, 2, 2), (1, 4, 1)])
def test_ranks_equal_one_process(random_ckpt, tmp_path, cfg, tp, batch):
    torch.set_num_threads(1)
    _check(_spawn(random_ckpt, cfg, tp, batch, tmp_path), _run(random_ckpt, batch))


@pytest.mark.skipif(not (FIX / "model_index.json").is_file(), reason=f"no Cosmos3 fixtures at {FIX}")
def test_fixture_model_cfg_and_tp(tmp_path):
    torch.set_num_threads(1)
    _check(_spawn(FIX, 2, 2, 1, tmp_path), _run(FIX, 1))


def test_cfg_parallel_needs_guidance(random_ckpt):
    from phyai_ros.models.cosmos3.parallel import Parallel
    with pytest.raises(ValueError, match="CFG-parallel needs"):
        Parallel(cfg_size=2).passes(cfg_on=False)


def test_tp_degree_must_divide_heads(random_ckpt):
    from phyai_ros.models.cosmos3.checkpoint import load_cosmos3_checkpoint, load_transformer_weights
    with pytest.raises(ValueError, match="tensor-parallel degree 3"):
        load_transformer_weights(load_cosmos3_checkpoint(random_ckpt), torch.float32, "cpu", 0, 3)


def test_tp_shards_concatenate_to_the_full_weights(random_ckpt):
    """Column shards of q/k/v / gate / up and row shards of the output projections are disjoint slices that
    cover the unsharded tensors."""
    from phyai_ros.models.cosmos3.checkpoint import load_cosmos3_checkpoint, load_transformer_weights
    ck = load_cosmos3_checkpoint(random_ckpt)
    full = load_transformer_weights(ck, torch.float32, "cpu")
    shards = [load_transformer_weights(ck, torch.float32, "cpu", r, 2) for r in range(2)]
    c, P = ck.transformer, "layers.1.gen."
    hq, hkv, d = c.num_heads // 2, c.num_kv_heads // 2, c.head_dim
    q = torch.cat([s[P + "qkv"][:hq * d] for s in shards])
    k = torch.cat([s[P + "qkv"][hq * d:(hq + hkv) * d] for s in shards])
    assert torch.equal(q, full[P + "qkv"][:c.q_dim]) and torch.equal(k, full[P + "qkv"][c.q_dim:c.q_dim + c.kv_dim])
    assert torch.equal(torch.cat([s[P + "out"] for s in shards], dim=1), full[P + "out"])
    assert torch.equal(torch.cat([s[P + "down"] for s in shards], dim=1), full[P + "down"])
    i = c.intermediate_size // 2
    gate = torch.cat([s[P + "up"][:i] for s in shards])
    assert torch.equal(gate, full[P + "up"][:c.intermediate_size])
