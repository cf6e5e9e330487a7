"""The RTC soft mask over a new chunk, shared by every family whose solver inpaints the previous chunk's rest
(the pi family's guided Euler loop, MiniCPM-Robot's and GR00T-style clean-action heads): one definition, so the
same request (d, n, schedule) weighs the same actions in every family. LeRobot 0.6.1's form, in float32 torch
(its linspace), so the parity fixtures' weights are reproduced bit for bit."""
from __future__ import annotations

import math

import torch

RTC_SCHEDULES = ("linear", "exp", "ones", "zeros")


def rtc_prefix_weights(inference_delay: int, execution_horizon: int, horizon: int,
                       schedule: str = "linear") -> torch.Tensor:
    """RTC soft mask W [horizon] float32 over the new chunk.

    W_i = 1 for i < d (actions already committed while inferring), a ramp from 1 towards 0 (exclusive at
    both ends) for d <= i < E, 0 for i >= E, with d = min(inference_delay, execution_horizon) and
    E = execution_horizon (LeRobot's name; the loop's n = len(Y)). 'exp' maps the ramp r to
    r * expm1(r) / (e - 1). 'ones': 1 for i < E; 'zeros': 1 for i < d only.
    """
    schedule = schedule.lower()
    if schedule not in RTC_SCHEDULES:
        raise ValueError(f"unknown RTC schedule {schedule!r}; expected one of {RTC_SCHEDULES}")
    if inference_delay < 0 or execution_horizon < 0:
        raise ValueError(f"inference_delay and execution_horizon must be >= 0, got {inference_delay}, "
                         f"{execution_horizon}")
    start = min(inference_delay, execution_horizon)
    end = execution_horizon
    if schedule == "zeros":
        w = torch.zeros(horizon)
        w[:start] = 1.0
        return w
    if schedule == "ones":
        w = torch.ones(horizon)
        w[end:] = 0.0
        return w
    n_ramp = horizon - max(horizon - end, 0) - start
    if end <= start or n_ramp <= 0:
        ramp = torch.zeros(0)
    else:
        ramp = torch.linspace(1, 0, n_ramp + 2)[1:-1]
    if schedule == "exp":
        ramp = ramp * torch.expm1(ramp).div(math.e - 1)
    parts = [torch.ones(min(start, horizon)), ramp, torch.zeros(max(horizon - end, 0))]
    return torch.cat(parts)[:horizon].to(torch.float32)
