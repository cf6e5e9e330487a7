"""Flow-matching solver for the pi family: fixed-step Euler from t=1 (noise) to t=0 (actions), with
optional real-time-chunking (RTC) guidance toward the unexecuted rest of the previous chunk.

Why separate pure-tensor pieces: the runner captures the loop in a CUDA graph, so everything that depends
only on the request's scalars (t / dt tables, RTC prefix weights, guidance weights, the padded target Y) is
built on the host before the loop (`euler_schedule`, `rtc_prefix_weights`, `rtc_guidance_weights`,
`pad_prev_chunk`), and the per-step math (`rtc_guided_velocity`, `euler_step`) is branch-free tensor code.
`sample` is the reference loop that wires them together; the runner may replace it with its own.

Conventions (LeRobot 0.6.1): dt = -1/steps; t_k = 1 + k*dt in python float math, fed as float32;
x <- x + dt * v. RTC (identity form, LeRobot's default): x1 = x_t - t v; err = (Y - x1) * W;
v_guided = v - g_k err, with tau = 1 - t and g_k = min(max_g, ((1-tau)/tau) * ((1-tau)^2 + tau^2)/(1-tau)^2),
inf -> max_g (evaluated in float32). The paper's form (`jacobian="vjp"`, Black et al. 2025) replaces err
by the vector-Jacobian product err^T d x1 / d x_t through the network (one backward pass per step).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Dict, List, Optional, Tuple

import torch

from phyai_ros.models.rtc_weights import rtc_prefix_weights

Tensor = torch.Tensor

RTC_JACOBIANS = ("identity", "vjp")


def euler_times(num_steps: int) -> Tuple[List[float], float]:
    """Python-float step times t_k = 1 + k*dt and dt = -1/num_steps."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    dt = -1.0 / num_steps
    return [1.0 + k * dt for k in range(num_steps)], dt


def euler_schedule(num_steps: int, device=None) -> Tuple[Tensor, float]:
    """-> (t table [num_steps] float32, dt)."""
    ts, dt = euler_times(num_steps)
    return torch.tensor(ts, dtype=torch.float32, device=device), dt


def rtc_guidance_weights(num_steps: int, max_guidance: float) -> Tensor:
    """Guidance weight g_k [num_steps] float32 for each Euler step (tau = 1 - t_k; see module docstring)."""
    ts, _ = euler_times(num_steps)
    max_g = torch.as_tensor(max_guidance, dtype=torch.float32)
    out = []
    for t in ts:
        tau = torch.as_tensor(1 - t, dtype=torch.float32)
        sq = (1 - tau) ** 2
        inv_r2 = (sq + tau ** 2) / sq
        c = torch.nan_to_num((1 - tau) / tau, posinf=float(max_g))
        g = torch.nan_to_num(c * inv_r2, posinf=float(max_g))
        out.append(torch.minimum(g, max_g))
    return torch.stack(out).to(torch.float32)


def pad_prev_chunk(prev: Tensor, horizon: int, action_dim: int) -> Tensor:
    """Previous chunk's left-over [B, n, D] (normalized) -> Y [B, horizon, action_dim], zero-padded in time and
    action dims; a left-over longer than the horizon is cut to it."""
    if prev.dim() == 2:
        prev = prev.unsqueeze(0)
    b, n, d = prev.shape
    if d > action_dim:
        raise ValueError(f"prev chunk has {d} action dims, more than the model's {action_dim}")
    y = torch.zeros(b, horizon, action_dim, dtype=torch.float32, device=prev.device)
    n = min(n, horizon)
    y[:, :n, :d] = prev[:, :n].to(torch.float32)
    return y


@dataclass
class RtcTensors:
    """One RTC request as the solver's tensors, in the model's normalized action space: the adapter's
    tensor-level RTC type (the loop's ``control.rtc.RtcRequest`` in robot units becomes this), built on the
    host before the loop (static shapes for graph capture).

    y [B|1, H, A] target (previous chunk's left-over, normalized, padded), weights [H], guidance [steps].
    """
    y: Tensor
    weights: Tensor
    guidance: Tensor
    jacobian: str = "identity"
    mode: str = "guided"   # "trained": weights is the hard frozen-prefix mask, fed as clean action tokens

    @property
    def graphable(self) -> bool:
        """The runner's captured loop holds the identity-form guided step only."""
        return self.mode == "guided" and self.jacobian == "identity"

    def to(self, device) -> "RtcTensors":
        return RtcTensors(self.y.to(device), self.weights.to(device), self.guidance.to(device), self.jacobian,
                        self.mode)


def build_rtc_tensors(prev_left_over: Tensor, inference_delay: int, execution_horizon: int, horizon: int,
                      action_dim: int, num_steps: int, schedule: str = "linear", max_guidance: float = 10.0,
                      jacobian: str = "identity", mode: str = "guided") -> RtcTensors:
    """RTC tensors for one request. prev_left_over [B, n, D] or [n, D] is in the model's normalized action
    space; execution_horizon is clamped to n (as LeRobot does). mode "trained" (training-time RTC, for
    checkpoints trained with prefix-action conditioning): the first inference_delay actions are fed as clean
    tokens (flow time 0) at every step and returned unchanged; the rest is sampled as usual."""
    if mode not in ("guided", "trained"):
        raise ValueError(f"RTC mode {mode!r} is not a flow-solver mode (guided, trained)")
    if jacobian not in RTC_JACOBIANS:
        raise ValueError(f"unknown RTC jacobian {jacobian!r}; expected one of {RTC_JACOBIANS}")
    if not torch.isfinite(prev_left_over).all():
        raise ValueError("RTC prev_left_over contains NaN or inf")
    n = prev_left_over.shape[-2]
    w = rtc_prefix_weights(int(inference_delay), min(int(execution_horizon), n), horizon,
                           "zeros" if mode == "trained" else schedule).to(prev_left_over.device)
    g = rtc_guidance_weights(num_steps, max_guidance).to(prev_left_over.device)
    return RtcTensors(pad_prev_chunk(prev_left_over, horizon, action_dim), w, g, jacobian, mode)


def rtc_guided_velocity(x_t: Tensor, v: Tensor, t: Tensor, y: Tensor, weights: Tensor, g: Tensor) -> Tensor:
    """Identity-Jacobian RTC step: v - g * (Y - (x_t - t v)) * W. All tensors, no host sync. weights [H] (one
    request) or [B, H] (a served batch: each row its own frozen prefix; a zero row is RTC off)."""
    err = (y - (x_t - t * v)) * weights[..., None]
    return v - g * err


def rtc_guided_velocity_vjp(velocity_fn: Callable[[Tensor], Tensor], x_t: Tensor, t: Tensor, y: Tensor,
                            weights: Tensor, g: Tensor) -> Tuple[Tensor, Tensor]:
    """Paper-form RTC step: correction = err^T d(x_t - t v(x_t))/d x_t (one VJP through the network).

    Returns (v_guided, v). Works under torch.no_grad (torch.func transforms ignore the outer no_grad).
    """
    def x1_fn(x):
        v = velocity_fn(x)
        return x - t * v, v

    x1, vjp_fn, v = torch.func.vjp(x1_fn, x_t, has_aux=True)
    err = (y - x1) * weights[:, None]
    (correction,) = vjp_fn(err)
    return v - g * correction, v


def per_token(table_k: Tensor, table_data: Tensor, frozen: Tensor, batch: int) -> Tensor:
    """Per-token time conditioning for training-time RTC: frozen tokens take the t = 0 table, the others
    step k's. table_* [..., W] (no token axis) -> [batch, ..., H, W]."""
    f = frozen.to(table_k.dtype)[:, None]
    mixed = table_k.unsqueeze(-2) * (1 - f) + table_data.unsqueeze(-2) * f
    return mixed.unsqueeze(0).expand(batch, *mixed.shape).contiguous()


def euler_step(x: Tensor, v: Tensor, dt: float) -> Tensor:
    return x + dt * v


def sample(velocity_fn: Callable[[Tensor, int], Tensor], noise: Tensor, num_steps: int,
           rtc: Optional[RtcTensors] = None, trace: Optional[Dict[str, List[Tensor]]] = None,
           t_table: Optional[Tensor] = None) -> Tensor:
    """Reference Euler loop. velocity_fn(x_t, k) -> v at step k (t = t_k). noise is x at t = 1 (float32).
    For training-time RTC (rtc.mode "trained") it is called as velocity_fn(x_t, k, frozen=mask [H]): tokens
    with mask 1 are clean actions at flow time 0, the others at t_k.

    t_table: the euler_schedule table already on the device (pass it when capturing the loop in a CUDA
    graph: building it here is a host-to-device copy). trace, if given, collects per-step 'v_t' (raw
    velocity), 'v_guided' (RTC only) and 'x_next'.
    """
    dt = -1.0 / num_steps
    if t_table is None:
        t_table, dt = euler_schedule(num_steps, device=noise.device)
    x = noise.to(torch.float32)
    for k in range(num_steps):
        t = t_table[k]
        if rtc is None:
            v = velocity_fn(x, k)
            v_used = v
        elif rtc.mode == "trained":
            # Frozen prefix as clean tokens: x there is Y itself (time 0) before and after the step.
            frozen = rtc.weights[:, None]
            x = frozen * rtc.y + (1 - frozen) * x
            v = velocity_fn(x, k, frozen=rtc.weights)
            v_used = v * (1 - frozen)
        elif rtc.jacobian == "vjp":
            v_used, v = rtc_guided_velocity_vjp(lambda xx: velocity_fn(xx, k), x, t, rtc.y, rtc.weights,
                                                rtc.guidance[k])
        else:
            v = velocity_fn(x, k)
            v_used = rtc_guided_velocity(x, v, t, rtc.y, rtc.weights, rtc.guidance[k])
        x = euler_step(x, v_used, dt)
        if trace is not None:
            trace.setdefault("v_t", []).append(v)
            if rtc is not None:
                trace.setdefault("v_guided", []).append(v_used)
            trace.setdefault("x_next", []).append(x)
    return x
