#!/usr/bin/env python3
"""LeRobot's own pi0 / pi0.5 timed on a CUDA device: the reference for scripts/bench_runtime.py.

Why a separate script: the comparison must run LeRobot's code, not ours, on the same device in the
same call. It builds LeRobot's policy (PI0Policy / PI05Policy, its bfloat16 option) at full size with
random weights drawn on the GPU (no hub access), then times ``policy.model.sample_actions`` from
preprocessed inputs (what bench_runtime times): eager at batch 1 and the --batches, then with LeRobot's
``compile_model`` option (torch.compile, --compile-mode, default reduce-overhead = CUDA graphs) at batch 1.
The JSON at --out is rewritten after every phase, so a run cut short during compilation keeps the rest.

Needs lerobot 0.6.1 with transformers 5.5.4 (see ../shared/device-wheels/README.md for the wheel set):

    python scripts/lerobot_reference.py --policy pi0 --out $OUT/lerobot_pi0.json
    python scripts/lerobot_reference.py --policy pi05 --no-compile
"""
from __future__ import annotations

import argparse
import gc
import importlib
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

import torch  # noqa: E402
from call_timing import call_ms  # noqa: E402  (scripts/, next to this file)

CAMERAS = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb")
# Token budget of each policy (LeRobot's defaults, as in our configs) and how many of them are valid:
# bench_runtime's task prompt is 20-odd tokens; LeRobot runs the whole padded budget either way.
POLICIES = {"pi0": (48, 24), "pi05": (200, 64)}


def policy_classes(name: str):
    if name == "pi0":
        from lerobot.policies.pi0.configuration_pi0 import PI0Config
        from lerobot.policies.pi0.modeling_pi0 import PI0Policy
        return PI0Config, PI0Policy
    from lerobot.policies.pi05.configuration_pi05 import PI05Config
    from lerobot.policies.pi05.modeling_pi05 import PI05Policy
    return PI05Config, PI05Policy


def disable_broken_peft() -> str | None:
    """LeRobot imports peft when it is installed; the device's peft may not import next to transformers
    5.5.4. peft plays no part in inference, so tell LeRobot it is absent rather than fail."""
    import lerobot.utils.import_utils as iu
    if not getattr(iu, "_peft_available", False):
        return None
    try:
        importlib.import_module("peft")
    except Exception as e:  # noqa: BLE001 - any import failure means the same here
        iu._peft_available = False
        return f"peft not importable ({type(e).__name__}); LeRobot told it is unavailable"
    return None


def build(name: str, compile_mode: str | None):
    from lerobot.configs.types import FeatureType, PolicyFeature
    cfg_cls, policy_cls = policy_classes(name)
    feats = {f"observation.images.{c}": PolicyFeature(type=FeatureType.VISUAL, shape=(3, 224, 224)) for c in CAMERAS}
    feats["observation.state"] = PolicyFeature(type=FeatureType.STATE, shape=(32,))
    cfg = cfg_cls(device="cuda", dtype="bfloat16", input_features=feats,
                  output_features={"action": PolicyFeature(type=FeatureType.ACTION, shape=(32,))},
                  chunk_size=50, n_action_steps=50, num_inference_steps=10, tokenizer_max_length=POLICIES[name][0],
                  compile_model=compile_mode is not None, compile_mode=compile_mode or "default")
    t = time.perf_counter()
    torch.manual_seed(0)
    with torch.device("cuda"):
        policy = policy_cls(cfg).eval()
    gen = torch.Generator(device="cuda").manual_seed(0)
    with torch.no_grad():  # LeRobot leaves some norms at 0; speed does not depend on the values
        for p in policy.parameters():
            p.normal_(0.0, 0.02, generator=gen)
    torch.cuda.synchronize()
    dtypes: dict = {}
    for p in policy.parameters():
        dtypes[str(p.dtype)] = dtypes.get(str(p.dtype), 0) + p.numel()
    return policy, {"build_s": time.perf_counter() - t, "params": sum(dtypes.values()), "param_dtypes": dtypes}


def inputs(policy, name: str, batch: int) -> tuple:
    """sample_actions' arguments: images in [-1, 1], camera masks, token ids + masks, (pi0: state), noise."""
    g = torch.Generator().manual_seed(batch)
    budget, valid = POLICIES[name]
    vocab = policy.model.paligemma_with_expert.paligemma.model.language_model.embed_tokens.num_embeddings
    images = [(torch.rand(batch, 3, 224, 224, generator=g) * 2 - 1).cuda() for _ in CAMERAS]
    img_masks = [torch.ones(batch, dtype=torch.bool, device="cuda") for _ in CAMERAS]
    tokens = torch.zeros(batch, budget, dtype=torch.long)
    tokens[:, :valid] = torch.randint(0, vocab, (batch, valid), generator=g)
    masks = torch.zeros(batch, budget, dtype=torch.bool)
    masks[:, :valid] = True
    noise = torch.randn(batch, 50, 32, generator=g).cuda()
    args = [images, img_masks, tokens.cuda(), masks.cuda()]
    if name == "pi0":
        args.append(torch.randn(batch, 32, generator=g).cuda())
    return tuple(args), noise


def measure(policy, name: str, batch: int, warmup: int, iters: int) -> dict:
    args, noise = inputs(policy, name, batch)

    def call():
        return policy.model.sample_actions(*args, noise=noise)

    torch.cuda.reset_peak_memory_stats()
    t = time.perf_counter()
    out = call()
    torch.cuda.synchronize()
    first_s = time.perf_counter() - t
    # Read now: under reduce-overhead the output lives in CUDA-graph memory that the next call overwrites.
    output = [list(out.shape), str(out.dtype), bool(torch.isfinite(out).all())]
    ms = sorted(call_ms(call, iters, warmup))
    med = statistics.median(ms)
    return {"batch": batch, "first_call_s": first_s, "median_ms": med, "p90_ms": ms[int(0.9 * (len(ms) - 1))],
            "p99_ms": ms[int(0.99 * (len(ms) - 1))], "min_ms": ms[0], "runs": len(ms),
            "samples_per_s": 1e3 * batch / med, "peak_mem_gb": torch.cuda.max_memory_allocated() / 1e9,
            "output": output}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--policy", choices=tuple(POLICIES), default="pi0")
    ap.add_argument("--batches", default="8,32", help="eager batch sizes besides 1")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--batch-iters", type=int, default=5)
    ap.add_argument("--compile-mode", default="reduce-overhead")
    ap.add_argument("--compile-iters", type=int, default=50)
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp")) / "lerobot_reference.json")
    a = ap.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("lerobot_reference: needs a CUDA device")
    import lerobot
    import transformers
    res: dict = {"policy": a.policy, "device": torch.cuda.get_device_name(), "torch": torch.__version__,
                 "lerobot": lerobot.__version__, "transformers": transformers.__version__,
                 "date": time.strftime("%Y-%m-%d"), "token_budget": POLICIES[a.policy][0], "cameras": len(CAMERAS),
                 "steps": 10, "chunk": [50, 32], "note": disable_broken_peft()}

    def save():
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1))

    def report(tag, r):
        print(f"[{a.policy} {tag}] batch {r['batch']}: median {r['median_ms']:.2f} ms, p99 {r['p99_ms']:.2f}, "
              f"{r['samples_per_s']:.1f} samples/s, first call {r['first_call_s']:.1f} s", flush=True)

    torch.set_float32_matmul_precision("highest")  # PyTorch's default, what LeRobot runs eagerly
    policy, res["eager_build"] = build(a.policy, None)
    res["eager"] = []
    with torch.no_grad():
        for b in [1] + [int(x) for x in a.batches.split(",") if x]:
            r = measure(policy, a.policy, b, 3 if b == 1 else 1, a.iters if b == 1 else a.batch_iters)
            res["eager"].append(r)
            report("eager", r)
            save()
    del policy
    gc.collect()
    torch.cuda.empty_cache()
    if not a.no_compile:
        policy, res["compiled_build"] = build(a.policy, a.compile_mode)
        res["compile_mode"] = a.compile_mode
        save()
        with torch.no_grad():
            r = measure(policy, a.policy, 1, 10, a.compile_iters)
        res["compiled"] = [r]
        report(f"compiled {a.compile_mode}", r)
        save()
    print(json.dumps(res))


if __name__ == "__main__":
    main()
