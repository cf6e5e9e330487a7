"""pi0.5 prompt construction: the task text plus the normalized state discretized into 256 bins.

Why here: pi0.5 feeds the robot state to the network only through the prompt, so the exact text matters
(LeRobot/openpi recipe): bins = digitize(state_norm, linspace(-1, 1, 257)[:-1]) - 1 with numpy (float32
state against float64 bin edges, no clipping: < -1 gives -1, >= 0.9921875 gives 255); the task is stripped
and '_' / '\n' become spaces; prompt = "Task: {task}, State: {b0 b1 ...};\nAction: ". The prompt is built
as (head, task, tail) so that a task too long for the token budget is cut rather than the state after it.
"""
from __future__ import annotations

from typing import List, Sequence, Tuple

import numpy as np

STATE_BINS = 256


def discretize_state(state_normalized: np.ndarray) -> np.ndarray:
    """[B, D] float32 normalized state -> int64 bins in [-1, 255]."""
    edges = np.linspace(-1, 1, STATE_BINS + 1)[:-1]
    return (np.digitize(np.asarray(state_normalized), bins=edges) - 1).astype(np.int64)


def clean_task(task: str) -> str:
    return task.strip().replace("_", " ").replace("\n", " ")


def prompt_parts(tasks: Sequence[str], state_normalized: np.ndarray) -> List[Tuple[str, str, str]]:
    """(head, cleaned task, tail) per batch row; the prompt is their concatenation."""
    bins = discretize_state(state_normalized)
    return [("Task: ", clean_task(t), f", State: {' '.join(map(str, b.tolist()))};\nAction: ")
            for t, b in zip(tasks, bins)]


def build_prompts(tasks: Sequence[str], state_normalized: np.ndarray) -> List[str]:
    return ["".join(p) for p in prompt_parts(tasks, state_normalized)]
