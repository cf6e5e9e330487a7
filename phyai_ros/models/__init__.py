"""The registry of model types: ``model.type`` (or a checkpoint's config.json ``type``) -> its adapter class.

A new model family adds its folder under ``phyai_ros/models/`` and one line here; nothing else shared changes.
Entries are "module:Class" strings so that reading the table (the node's parameter choices, the replay tools)
imports no torch. An adapter class registered here provides what the policy bridge (phyai_ros/policies.py)
uses, in robot units and numpy at batch 1:

    from_files(checkpoint, tokenizer, norm_stats, camera_names=, device=, dtype=) -> adapter
    rtc_modes (the control.rtc.RTC_MODES it supports), rtc_max_guidance, rtc_jacobian
    use_runner(use_graphs, token_bucket)           the runner it samples through (graphs on CUDA)
    capture_buckets(images, state, eager=False, min_cameras=None)
                                                   graph capture at start-up (eager: the same shapes without
                                                   graphs, for the operator autotune's recording; min_cameras:
                                                   also every count of cameras present from it up)
    predict(images, state, task, noise, rtc) -> [H, D]     rtc: control.rtc.RtcRequest or None
    make_noise(1, generator), camera_names, state_dim, action_dim, chunk_size, image_size (None: any aspect)
    fit_task(task, state) -> (prompt, cut)         an instruction too long for the prompt is reported once
    needs_files        the file parameters it reads besides the checkpoint ("tokenizer", "norm_stats")
    masks_cameras      False: every camera slot is required (no masked slots)
    select_embodiment(value)                       only where ``model.embodiment`` means something

An instance may narrow ``rtc_modes`` (a checkpoint that cannot do RTC); the bridge checks both.

A checkpoint's config.json ``type`` is a registry key, or an alias of one (``CHECKPOINT_TYPES``: LeRobot writes
"groot" for GR00T N1.7).
"""
from __future__ import annotations

import importlib
from pathlib import Path

MODEL_TYPES: dict[str, str] = {
    "pi05": "phyai_ros.models.pi05.adapter:Pi05Policy",
    "pi0": "phyai_ros.models.pi0.adapter:Pi0Policy",
    "groot_n17": "phyai_ros.models.groot_n17.node_policy:GrootNodePolicy",
}
# config.json "type" -> registry key, where the two differ
CHECKPOINT_TYPES: dict[str, str] = {"groot": "groot_n17"}


def adapter_class(model_type: str) -> type:
    """The adapter class registered for ``model_type`` (ValueError naming the registered types)."""
    if model_type not in MODEL_TYPES:
        raise ValueError(f"model type {model_type!r} is not available (registered: {', '.join(MODEL_TYPES)})")
    module, name = MODEL_TYPES[model_type].split(":")
    return getattr(importlib.import_module(module), name)


def checkpoint_type(checkpoint) -> str:
    """The registry type of a checkpoint folder's config.json ``type`` (pi0.5 when it names none)."""
    from phyai_ros.models.common.checkpoint_io import read_json
    kind = read_json(Path(checkpoint) / "config.json").get("type", "pi05")
    return CHECKPOINT_TYPES.get(kind, kind)


def check_rtc_mode(model_type: str, mode: str) -> None:
    """Refuse an RTC mode the model type does not support, saying which type supports which modes."""
    modes = adapter_class(model_type).rtc_modes
    if mode not in modes:
        support = "; ".join(f"{t}: {', '.join(adapter_class(t).rtc_modes)}" for t in MODEL_TYPES)
        raise ValueError(f"rtc.mode {mode!r} is not supported by model type {model_type} ({support})")


__all__ = ["MODEL_TYPES", "CHECKPOINT_TYPES", "adapter_class", "checkpoint_type", "check_rtc_mode"]
