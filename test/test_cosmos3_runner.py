"""The Cosmos3 runner (phyai_ros/models/cosmos3/runner.py) and batching.

CPU (CI): the conditioning is computed once per observation and kept (several chunks from one observation
equal fresh runs), a new observation invalidates it, the text keys / values stay while the instruction does, prompt padding to a token bucket and batching several
requests (cond + uncond rows of different prompt lengths, masked) leave every item's chunk as it is alone.
GPU (`gpu` marker): CUDA-graph replay equals the eager loop; fp32 (TF32 off) within 1e-4 of the fixtures.
"""
import dataclasses

import numpy as np
import pytest
import torch

from fixture_sets import cosmos3_fixture_dir

FIX = cosmos3_fixture_dir()
CASE = "a2_pusht_g3_neg"          # CFG with a negative prompt: cond and uncond rows of different lengths
pytestmark = pytest.mark.skipif(not (FIX / "expected.safetensors").is_file(),
                                reason=f"Cosmos3 parity fixtures not found at {FIX}")


def maxabs(a, b):
    return (a.detach().float().cpu() - b.detach().float().cpu()).abs().max().item()


@pytest.fixture(scope="module")
def fx():
    import json

    from safetensors.torch import load_file
    meta = json.loads((FIX / "inputs.json").read_text())
    return {"case": {c["name"]: c for c in meta["cases"]}[CASE], "inp": load_file(str(FIX / "inputs.safetensors")),
            "exp": load_file(str(FIX / "expected.safetensors"))}


def policy(fx, device="cpu", dtype=torch.float32, **kw):
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    from phyai_ros.models.cosmos3.cases import case_settings
    return Cosmos3Adapter.from_files(FIX / "pipeline", device=device, dtype=dtype, settings=case_settings(fx["case"]),
                                    **kw)


def noise(fx):
    from phyai_ros.models.cosmos3.cases import case_inputs
    return case_inputs(fx["inp"], CASE)


@pytest.fixture(scope="module")
def pol(fx):
    return policy(fx)


def test_conditioning_is_kept_across_chunks(pol, fx):
    image, (vis, act) = noise(fx)
    x = pol.prepare({"image": image}, fx["case"]["instruction"])
    runner = pol.runner
    bucket = runner.set_observation(pol.stages.observation(x), x.layout)
    ctx = bucket.context
    first = runner.sample(bucket, vis, act)[0].clone()
    other = runner.sample(bucket, torch.randn_like(vis), torch.randn_like(act))[0].clone()
    again = runner.sample(bucket, vis, act)[0].clone()
    assert bucket.context is ctx                      # not recomputed per chunk
    assert torch.equal(first, again) and maxabs(first, other) > 1e-3
    assert maxabs(first[0, :, :2], fx["exp"][f"{CASE}.final_action"]) <= 1e-4
    # a new observation in the same bucket replaces the conditioning
    y = pol.prepare({"image": np.ascontiguousarray(image.numpy()[::-1])}, fx["case"]["instruction"])
    assert runner.set_observation(pol.stages.observation(y), y.layout) is bucket
    assert bucket.context is not ctx
    assert maxabs(runner.sample(bucket, vis, act)[0], first) > 1e-3


def test_text_cache_is_kept_while_the_instruction_stays(fx):
    """The text pathway's keys / values follow the prompt rows alone: a new image with the same instruction keeps
    them (not run again) and gives what a runner computing everything gives, bit for bit; another instruction of
    the same padded length (the same bucket) runs them again; no key always runs them."""
    from phyai_ros.models.cosmos3.runner import Cosmos3Runner
    pol = policy(fx, token_bucket=64)
    runner = Cosmos3Runner(pol.stages, use_graphs=False)
    image, (vis, act) = noise(fx)
    flipped = np.ascontiguousarray(image.numpy()[::-1])
    task = fx["case"]["instruction"]
    other_task = task[:-1] + ("x" if task[-1] != "x" else "y")        # as long (the stand-in tokenizer is bytes)

    def chunk(r, img, t, keyed=True):
        x = pol.prepare({"image": img}, t)
        obs = pol.stages.observation(x)
        return r.run(obs, x.layout, vis, act, text_key=pol.stages.text_key(x) if keyed else None)[0].clone()

    chunk(runner, image, task)
    assert runner.text_runs == 1
    kept = chunk(runner, flipped, task)
    assert runner.text_runs == 1 and len(runner.buckets()) == 1
    assert torch.equal(kept, chunk(Cosmos3Runner(pol.stages, use_graphs=False), flipped, task))
    other = chunk(runner, flipped, other_task)
    assert runner.text_runs == 2 and len(runner.buckets()) == 1          # the same bucket, new rows
    assert torch.equal(other, chunk(Cosmos3Runner(pol.stages, use_graphs=False), flipped, other_task))
    assert maxabs(other, kept) > 1e-4
    chunk(runner, flipped, other_task, keyed=False)
    assert runner.text_runs == 3
    pol.runner = runner                  # the adapter passes its key (the unkeyed run left none to match)
    pol.sample_actions(pol.prepare({"image": image}, other_task), (vis, act))
    pol.sample_actions(pol.prepare({"image": flipped}, other_task), (vis, act))
    assert runner.text_runs == 4


def test_sample_needs_an_observation(pol, fx):
    from phyai_ros.models.cosmos3.runner import Cosmos3Runner
    image, (vis, act) = noise(fx)
    x = pol.prepare({"image": image}, fx["case"]["instruction"])
    runner = Cosmos3Runner(pol.stages, use_graphs=False)
    bucket = runner._bucket(pol.stages.observation(x), x.layout)
    with pytest.raises(RuntimeError, match="set_observation"):
        runner.sample(bucket, vis, act)


def test_token_bucket_padding_changes_nothing(fx):
    image, nz = noise(fx)
    pol = policy(fx, token_bucket=64)
    x = pol.prepare({"image": image}, fx["case"]["instruction"])
    obs = pol.stages.observation(x)
    assert obs["ids"].shape[1] % 64 == 0 and obs["ids"].shape[1] > len(x.cond_ids[0])
    assert maxabs(pol.sample_actions(x, nz)[0], fx["exp"][f"{CASE}.final_action"]) <= 1e-4


def test_batch_items_equal_their_single_runs(pol, fx):
    """Two requests (prompts of different lengths: four rows, three of them padded) in one batch."""
    image, (vis, act) = noise(fx)
    tasks = [fx["case"]["instruction"], "push the T block into the green target region slowly and carefully"]
    x = pol.prepare({"image": np.stack([image.numpy()] * 2)}, tasks)
    assert len(set(map(len, x.cond_ids))) == 2
    vis2 = torch.cat([vis, torch.randn_like(vis)])
    act2 = torch.cat([act, torch.randn_like(act)])
    both = pol.sample_actions(x, (vis2, act2))
    for i, task in enumerate(tasks):
        alone = pol.sample_actions(pol.prepare({"image": image}, task), (vis2[i:i + 1], act2[i:i + 1]))
        assert maxabs(both[i], alone[0]) <= 1e-5
    assert maxabs(both[0], fx["exp"][f"{CASE}.final_action"]) <= 1e-4


def test_without_guidance_one_pass_runs(fx):
    from phyai_ros.models.cosmos3 import Cosmos3Adapter
    from phyai_ros.models.cosmos3.cases import case_settings
    s = dataclasses.replace(case_settings(fx["case"]), guidance=1.0)
    pol = Cosmos3Adapter.from_files(FIX / "pipeline", settings=s)
    image, nz = noise(fx)
    x = pol.prepare({"image": image}, fx["case"]["instruction"])
    assert pol.stages.passes == ("cond",) and pol.stages.observation(x)["ids"].shape[0] == 1
    trace = {}
    pol.sample_actions(x, nz, trace)
    assert "uncond_action_velocity_raw" not in trace


# ------------------------------------------------------------------ GPU
@pytest.mark.gpu
def test_graphs_equal_eager_and_fixture_fp32(fx):
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    pol = policy(fx, device="cuda")
    image, nz = noise(fx)
    x = pol.prepare({"image": image}, fx["case"]["instruction"])
    eager = pol.sample_actions(x, nz)
    pol.use_runner(use_graphs=True)
    graphed = pol.sample_actions(x, nz)
    again = pol.sample_actions(x, nz)                  # replay, the text graph not replayed (same instruction)
    assert pol.runner.use_graphs and len(pol.runner.registry.keys()) == 3 and pol.runner.text_runs == 1
    assert maxabs(graphed, eager) <= 1e-6 and torch.equal(graphed, again)
    assert maxabs(graphed[0], fx["exp"][f"{CASE}.final_action"]) <= 1e-4
    y = pol.prepare({"image": np.ascontiguousarray(image.numpy()[::-1])}, fx["case"]["instruction"])
    kept = pol.sample_actions(y, nz)                   # a new image, the kept text keys / values
    pol.use_runner(use_graphs=False)
    assert maxabs(kept, pol.sample_actions(y, nz)) <= 1e-6


@pytest.mark.gpu
def test_bf16_graphs_finite_and_close(fx):
    pol = policy(fx, device="cuda", dtype=torch.bfloat16)
    pol.use_runner(use_graphs=True)
    image, nz = noise(fx)
    out = pol.sample_actions(pol.prepare({"image": image}, fx["case"]["instruction"]), nz)
    ref = fx["exp"][f"{CASE}.final_action"]
    # bf16 weights and activations (8 bits of mantissa) through 2 layers, 4 steps, guidance 3: a loose bound
    assert torch.isfinite(out).all() and maxabs(out[0], ref) <= 0.1 * max(1.0, ref.abs().max().item())


def test_the_runner_keeps_a_bounded_set_of_shape_buckets(fx):
    """Instructions of three padded lengths (three buckets) through a runner that keeps two: two stay, the least
    recently used goes, and a bucket made again computes what it computed before."""
    from phyai_ros.models.cosmos3.runner import MAX_BUCKETS, Cosmos3Runner
    pol = policy(fx, token_bucket=4)
    pol.runner = Cosmos3Runner(pol.stages, use_graphs=False, max_buckets=2)
    image, (vis, act) = noise(fx)
    tasks = [fx["case"]["instruction"] + " and then" * i for i in (0, 3, 6)]

    def chunk(task):
        x = pol.prepare({"image": image}, task)
        obs = pol.stages.observation(x)
        key = pol.runner.bucket_key(obs, x.layout)
        return key, pol.runner.run(obs, x.layout, vis, act)[0].clone()
    first = [chunk(t) for t in tasks]
    assert len({k for k, _ in first}) == 3
    assert pol.runner.buckets() == [first[1][0], first[2][0]]        # the first, least recently used, went
    key, again = chunk(tasks[0])
    assert key == first[0][0] and torch.equal(again, first[0][1])
    assert pol.runner.buckets() == [first[2][0], first[0][0]]
    assert MAX_BUCKETS >= 4
