"""`python -m phyai_ros.predict` for GR00T N1.7 checkpoints (config.json type "groot"): the same flags as for
pi0 / pi0.5, read with GR00T's meaning.

- --case NAME takes the case's facts from --tasks-json's `cases[NAME]` (fixture inputs.json): embodiment
  ids (`embodiment_id_used`), RTC inference delay / execution horizon; `float_resize` runs the float
  (CUDA-like) image resize. Without a case entry the ids are --inputs' `embodiment_id`, else the checkpoint's.
- RTC is GR00T's native one (frozen prefix + ramp): --inference-delay [--execution-horizon], previous
  chunk from --prev-left-over (normalized model space unless --prev-left-over-space robot).
- Output: actions [B, chunk, action_dim] (robot units) and actions.model [B, H, max_action_dim].
"""
from __future__ import annotations

import torch

from .adapter import GrootPolicy, GrootRtc

FLOAT_RESIZE_CASE = "float_resize"


def _case(meta, name):
    return ((meta or {}).get("cases") or {}).get(name) or {} if name else {}


def _embodiment_ids(case: dict, inputs: dict, batch: int):
    ids = case.get("embodiment_id_used")
    if ids is None and "embodiment_id" in inputs:
        ids = inputs["embodiment_id"].tolist()
    if ids is not None and len(ids) != batch:
        from phyai_ros.predict import InputError
        raise InputError(f"{len(ids)} embodiment ids for a batch of {batch}")
    return ids


def _rtc(args, case: dict, inputs: dict, policy: GrootPolicy):
    from phyai_ros.predict import InputError, _require_finite, _require_range
    delay = case.get("inference_delay") if args.inference_delay is None else args.inference_delay
    horizon = case.get("execution_horizon") if args.execution_horizon is None else args.execution_horizon
    if delay is None:
        if args.rtc or horizon is not None:
            raise InputError("GR00T's native RTC needs --inference-delay (or a --case that has one)")
        return None
    _require_range("--inference-delay", delay, 0, policy.config.head.action_horizon)
    _require_range("--execution-horizon", horizon, 0, policy.config.head.action_horizon)
    if args.prev_left_over not in inputs:
        raise InputError(f"RTC needs {args.prev_left_over!r} in --inputs")
    prev = _require_finite(f"--inputs key {args.prev_left_over}", inputs[args.prev_left_over].to(torch.float32))
    if args.prev_left_over_space == "robot":
        prev = policy.normalize_actions(prev)
    return GrootRtc(prev, int(delay), None if horizon is None else int(horizon))


def run(args) -> int:
    """Exit status as phyai_ros.predict documents."""
    from phyai_ros.models.common.checkpoint_io import read_safetensors_file
    from phyai_ros.predict import IMG_PREFIX, InputError, _load_noise, _read_tasks, _require_finite, run_and_save

    dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16}[args.dtype]
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise InputError(f"--device {args.device}: no CUDA device is available")
    inputs = read_safetensors_file(args.inputs)
    images = {k[len(IMG_PREFIX):]: v for k, v in inputs.items() if k.startswith(IMG_PREFIX)}
    if "raw.observation.state" not in inputs:
        raise InputError(f"--inputs {args.inputs} lacks raw.observation.state")
    state = inputs["raw.observation.state"]
    batch = state.shape[0] if state.dim() == 2 else 1
    meta, tasks = _read_tasks(args.tasks_json, batch) if args.tasks_json else (None, [args.task] * batch)
    case = _case(meta, args.case)
    resize = "float" if args.case == FLOAT_RESIZE_CASE else "auto"
    policy = GrootPolicy.from_files(args.checkpoint, device=args.device, dtype=dtype, resize_mode=resize)
    noise = _load_noise(args.noise, inputs)
    if noise is None:
        noise = policy.make_noise(batch, torch.Generator().manual_seed(args.seed))
    _require_finite(f"--noise {args.noise}" if args.noise else f"--inputs {args.inputs} noise", noise)
    rtc = _rtc(args, case, inputs, policy)
    ids = _embodiment_ids(case, inputs, batch)

    def infer():
        prepared = policy.prepare(images, state.numpy(), tasks, ids)
        actions_model = policy.sample_actions(prepared, noise, rtc)
        return ({"actions": policy.decode(actions_model, prepared), "actions.model": actions_model},
                {"prompts": prepared.prompts, "slots": prepared.cameras})
    return run_and_save(args, infer, ", groot")
