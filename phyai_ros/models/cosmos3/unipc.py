"""UniPC multistep (predictor UniP + corrector UniC, B(h) variants) for flow-matching velocities, as
diffusers 0.42.1's UniPCMultistepScheduler computes it, with the schedule read from the checkpoint's
scheduler_config.json.

Why a plan: every scalar of the update (sigmas, the B(h) coefficients, the corrector / predictor weights)
depends only on the step count and the config, so `unipc_plan` computes them once, on the host, in float32
0-dim tensor arithmetic exactly as diffusers does, and `UniPCState.step` applies them to device tensors with
no host sync and no data-dependent branch: the denoising loop that calls it can be captured in a CUDA graph.
The model output is a flow velocity v (x0 = x - sigma v); time runs from noise (sigma ~ 1) to data (0). Each
stream (vision, action) keeps its own history, as the pipeline's deep-copied schedulers do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import List, Optional, Tuple

import numpy as np
import torch

from phyai_ros.models.files import CheckpointError

MAX_TRAIN_TIMESTEPS = 100_000   # scheduler_config.json bounds (1000 and 1.0 / 5.0 in the released ones)
MAX_FLOW_SHIFT = 1000.0

Tensor = torch.Tensor


@dataclass(frozen=True)
class UniPCConfig:
    """The scheduler_config.json fields the flow-sigma UniPC path reads (anything else it would need is refused)."""

    num_train_timesteps: int = 1000
    solver_order: int = 2
    solver_type: str = "bh2"
    lower_order_final: bool = True
    disable_corrector: Tuple[int, ...] = ()
    flow_shift: float = 1.0
    final_sigmas_type: str = "zero"
    shift_terminal: Optional[float] = None
    native_flow_schedule: bool = False       # the pipeline's use_native_flow_schedule (model_index.json)

    @classmethod
    def from_json(cls, cfg: dict, source: Optional[Path] = None, native_flow_schedule: bool = False) -> "UniPCConfig":
        where = source or "scheduler config"
        if cfg.get("_class_name", "UniPCMultistepScheduler") != "UniPCMultistepScheduler":
            raise CheckpointError(f"{where}: scheduler {cfg.get('_class_name')!r}; only UniPCMultistepScheduler is "
                                  "implemented")
        required = {"prediction_type": "flow_prediction", "use_flow_sigmas": True, "predict_x0": True}
        for key, want in required.items():
            if cfg.get(key, {"predict_x0": True}.get(key)) != want:
                raise CheckpointError(f"{where}: {key} = {cfg.get(key)!r}; the Cosmos3 policy needs {want!r} "
                                      "(a flow-velocity model on flow sigmas)")
        refused = ("thresholding", "use_karras_sigmas", "use_exponential_sigmas", "use_beta_sigmas",
                   "use_dynamic_shifting", "rescale_betas_zero_snr")
        on = [k for k in refused if cfg.get(k)]
        if on:
            raise CheckpointError(f"{where}: {', '.join(on)} not supported with flow sigmas here")
        order, solver, final = cfg.get("solver_order", 2), cfg.get("solver_type", "bh2"), \
            cfg.get("final_sigmas_type", "zero")
        steps, shift, terminal = cfg.get("num_train_timesteps", 1000), cfg.get("flow_shift", 1.0), \
            cfg.get("shift_terminal")
        disable = cfg.get("disable_corrector") or []
        solver = {"midpoint": "bh2", "heun": "bh2", "logrho": "bh2"}.get(solver, solver)   # diffusers' aliases
        ok = (isinstance(order, int) and 1 <= order <= 8 and solver in ("bh1", "bh2")
              and final in ("zero", "sigma_min") and isinstance(steps, int) and 2 <= steps <= MAX_TRAIN_TIMESTEPS
              and isinstance(shift, (int, float)) and math.isfinite(shift) and 0 < shift <= MAX_FLOW_SHIFT
              and (terminal is None or (isinstance(terminal, (int, float)) and 0 <= terminal < 1))
              and isinstance(disable, list) and all(isinstance(i, int) for i in disable)
              and isinstance(cfg.get("lower_order_final", True), bool))
        if not ok:
            raise CheckpointError(f"{where}: solver_order {order!r}, solver_type {solver!r}, final_sigmas_type "
                                  f"{final!r}, num_train_timesteps {steps!r}, flow_shift {shift!r}, shift_terminal "
                                  f"{terminal!r} or disable_corrector {disable!r} out of range")
        return cls(num_train_timesteps=steps, solver_order=order, solver_type=solver,
                   lower_order_final=cfg.get("lower_order_final", True), disable_corrector=tuple(disable),
                   flow_shift=float(shift), final_sigmas_type=final,
                   shift_terminal=None if terminal is None else float(terminal),
                   native_flow_schedule=bool(native_flow_schedule))

    def to_json(self) -> dict:
        return {"_class_name": "UniPCMultistepScheduler", "_diffusers_version": "0.42.1",
                "num_train_timesteps": self.num_train_timesteps, "solver_order": self.solver_order,
                "prediction_type": "flow_prediction", "predict_x0": True, "solver_type": self.solver_type,
                "lower_order_final": self.lower_order_final, "disable_corrector": list(self.disable_corrector),
                "use_flow_sigmas": True, "flow_shift": self.flow_shift, "final_sigmas_type": self.final_sigmas_type,
                "shift_terminal": self.shift_terminal, "timestep_spacing": "linspace", "thresholding": False,
                "use_karras_sigmas": False, "use_exponential_sigmas": False, "use_beta_sigmas": False,
                "use_dynamic_shifting": False}


def flow_schedule(cfg: UniPCConfig, num_steps: int) -> Tuple[np.ndarray, Tensor]:
    """(integer timesteps [N] int64, sigmas [N + 1] float32, last 0 or sigma_min) of set_timesteps."""
    if num_steps < 1:
        raise ValueError(f"num_steps must be >= 1, got {num_steps}")
    n_train = cfg.num_train_timesteps
    if cfg.native_flow_schedule:
        sigmas = np.linspace(1.0 - 1.0 / n_train, 0.0, num_steps + 1)[:-1]
    else:
        sigmas = np.linspace(1, 1 / n_train, num_steps + 1)[:-1]
    sigmas = cfg.flow_shift * sigmas / (1 + (cfg.flow_shift - 1) * sigmas)
    if cfg.shift_terminal:
        one_minus = 1 - sigmas
        sigmas = 1 - one_minus / (one_minus[-1] / (1 - cfg.shift_terminal))
    if np.fabs(sigmas[0] - 1) < 1e-6:
        sigmas[0] -= 1e-6       # diffusers: keeps log(alpha) finite in the first update
    timesteps = (sigmas * n_train).copy().astype(np.int64)
    last = sigmas[-1] if cfg.final_sigmas_type == "sigma_min" else 0
    sig = torch.from_numpy(np.concatenate([sigmas, [last]]).astype(np.float32))
    if num_steps > 1 and timesteps[0] == timesteps[1]:
        raise ValueError(f"{num_steps} steps give duplicate leading timesteps ({timesteps[:2].tolist()}); diffusers "
                         "would then skip a sigma: not supported")
    return timesteps, sig


@dataclass(frozen=True)
class Update:
    """x_new = ratio * x_base - c1 * m0 - c2 * (sum_j rho_j (m_j - m0) / rk_j [+ rho_t (x0_now - m0)]).

    `history` are indexes into the x0 history, newest last (-1 = m0); for the corrector, `base` is the
    sample before the last predictor and `rho_t` weighs the new x0 (None for the predictor)."""

    ratio: float
    c1: float
    c2: float
    rks: Tuple[float, ...]
    rhos: Tuple[float, ...]
    rho_t: Optional[float] = None


@dataclass(frozen=True)
class StepPlan:
    sigma: float                     # sigma of this step: x0 = x - sigma * v
    corrector: Optional[Update]
    predictor: Update


def _alpha_sigma_lambda(sig: Tensor) -> Tuple[Tensor, Tensor, Tensor]:
    alpha, sigma = 1 - sig, sig
    return alpha, sigma, torch.log(alpha) - torch.log(sigma)


def _coefficients(order: int, sig_t: Tensor, sig_s0: Tensor, prev_sigs: List[Tensor], bh2: bool,
                  corrector: bool) -> Update:
    """diffusers' multistep_uni_{p,c}_bh_update scalars, in its float32 0-dim tensor arithmetic."""
    alpha_t, sigma_t, lambda_t = _alpha_sigma_lambda(sig_t)
    _, sigma_s0, lambda_s0 = _alpha_sigma_lambda(sig_s0)
    h = lambda_t - lambda_s0
    rks = [(_alpha_sigma_lambda(s)[2] - lambda_s0) / h for s in prev_sigs]
    rk_all = torch.stack(rks + [torch.ones(())])
    hh = -h
    h_phi_1 = torch.expm1(hh)
    h_phi_k = h_phi_1 / hh - 1
    b_h = torch.expm1(hh) if bh2 else hh
    factorial, rows, b = 1, [], []
    for i in range(1, order + 1):
        rows.append(torch.pow(rk_all, i - 1))
        b.append(h_phi_k * factorial / b_h)
        factorial *= i + 1
        h_phi_k = h_phi_k / hh - 1 / factorial
    r_mat, b_vec = torch.stack(rows), torch.stack(b)
    if corrector:
        rhos = torch.ones(1) * 0.5 if order == 1 else torch.linalg.solve(r_mat, b_vec)
        rho_list, rho_t = [float(v) for v in rhos[:-1]], float(rhos[-1])
    else:
        rho_t = None
        if order == 1:
            rho_list = []
        elif order == 2:
            rho_list = [0.5]
        else:
            rho_list = [float(v) for v in torch.linalg.solve(r_mat[:-1, :-1], b_vec[:-1])]
    upd = Update(float(sigma_t / sigma_s0), float(alpha_t * h_phi_1), float(alpha_t * b_h),
                 tuple(float(r) for r in rks), tuple(rho_list), rho_t)
    used = [upd.ratio, upd.c1] + ([upd.c2] if (rho_list or corrector) else []) + list(upd.rks) + list(rho_list)
    if not all(math.isfinite(v) for v in used) or not all(r != 0 for r in upd.rks):
        raise ValueError(f"UniPC coefficients are not finite for this schedule ({upd}); check solver_type / "
                         "final_sigmas_type in the scheduler config")
    return upd


def unipc_plan(cfg: UniPCConfig, num_steps: int) -> Tuple[np.ndarray, Tensor, List[StepPlan]]:
    """(timesteps, sigmas, per-step plan) for `num_steps` steps; the state machine of diffusers' `step`
    (warm-up orders, lower_order_final, disabled correctors) unrolled on the host."""
    timesteps, sigmas = flow_schedule(cfg, num_steps)
    n, plan, lower, prev_order = len(timesteps), [], 0, None
    for i in range(n):
        corr = None
        if i > 0 and (i - 1) not in cfg.disable_corrector:
            prev = [sigmas[i - (j + 1)] for j in range(1, prev_order)]
            corr = _coefficients(prev_order, sigmas[i], sigmas[i - 1], prev, cfg.solver_type == "bh2", True)
        order = min(cfg.solver_order, n - i) if cfg.lower_order_final else cfg.solver_order
        order = min(order, lower + 1)
        pred = _coefficients(order, sigmas[i + 1], sigmas[i], [sigmas[i - j] for j in range(1, order)],
                             cfg.solver_type == "bh2", False)
        plan.append(StepPlan(float(sigmas[i]), corr, pred))
        lower = min(lower + 1, cfg.solver_order)
        prev_order = order
    return timesteps, sigmas, plan


class UniPCState:
    """One stream's multistep history; `step` is capture-safe (tensor ops with host-constant scalars)."""

    def __init__(self, plan: List[StepPlan], order: int):
        self.plan = plan
        self.order = order
        self.history: List[Tensor] = []
        self.last: Optional[Tensor] = None

    @staticmethod
    def _residual(upd: Update, hist: List[Tensor], m0: Tensor) -> Optional[Tensor]:
        """sum_j rho_j * (m_j - m0) / rk_j over the older x0s, newest first (diffusers' D1s einsum)."""
        res = None
        for j, (rho, rk) in enumerate(zip(upd.rhos, upd.rks), start=1):
            term = rho * ((hist[-(j + 1)] - m0) / rk)
            res = term if res is None else res + term
        return res

    def step(self, i: int, x: Tensor, v: Tensor) -> Tensor:
        """Sample after step i from sample x and velocity v (the guided one)."""
        p = self.plan[i]
        x0 = x - p.sigma * v
        if p.corrector is not None and self.last is not None:
            c, m0 = p.corrector, self.history[-1]
            base = c.ratio * self.last - c.c1 * m0
            res = self._residual(c, self.history, m0)
            tail = c.rho_t * (x0 - m0)
            x = base - c.c2 * (tail if res is None else res + tail)
        self.history = (self.history + [x0])[-self.order:]
        self.last = x
        c = p.predictor
        out = c.ratio * x - c.c1 * x0
        res = self._residual(c, self.history, x0)
        return out if res is None else out - c.c2 * res


__all__ = ["UniPCConfig", "UniPCState", "StepPlan", "Update", "flow_schedule", "unipc_plan"]
