"""Cosmos3 policy inference as the stage functions a runner drives (phyai_ros/models/cosmos3/runner.py).

    observation(inputs) -> {name: tensor}    host side: token ids, mRoPE tables, masks, domains (fixed shapes)
    text(obs) -> (keys, values)              the text pathway's per-layer keys / values of every pass: a
                                             function of the prompt rows alone (``text_key``), kept while the
                                             instruction stays
    condition(obs, text) -> Context          once per observation: the VAE latent of the conditioning frame,
                                             with the text cache
    loop(ctx, vision_noise, action_noise) -> (actions, vision latents)   all denoising steps (capture-safe)

Rows: a batch of B observations runs each guidance pass this rank computes (cond, uncond: `Parallel.passes`)
as its own B rows of one batch, cond rows first, so classifier-free guidance is one transformer call of 2B
rows per step on one device; under CFG-parallel each rank runs its B rows and the velocities are gathered.
Each step: tokens from the current latents, the generation pathway against the text cache, velocities (frame 0
zero, action columns past the domain's raw width zeroed), guidance v_u + g (v_c - v_u), one UniPC step per
stream (vision and action keep separate histories), action columns past the raw width zeroed again.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Dict, List, Optional, Tuple

import torch

from . import transformer as tfm
from . import vae as vae_mod
from .config import Cosmos3Settings, TransformerConfig, VaeConfig
from .layout import GenLayout, mrope_cos_sin, position_ids
from .parallel import SINGLE, Parallel
from .unipc import UniPCConfig, UniPCState, unipc_plan

Tensor = torch.Tensor


@dataclass
class Cosmos3Inputs:
    """A prepared batch (host side): one canvas frame per item (all of one canvas), the token ids of both
    passes per item, the domain of every item, and the settings they were made for."""

    frames: Tensor                  # [B, 3, Hc, Wc] float32 in [-1, 1]
    canvas: object                  # canvas.Canvas
    cond_ids: List[List[int]]
    uncond_ids: List[List[int]]
    domain_ids: List[int]
    raw_dims: List[int]
    captions: List[str]
    layout: GenLayout
    settings: Cosmos3Settings

    @property
    def batch(self) -> int:
        return self.frames.shape[0]


@dataclass
class Context:
    """What one observation's denoising reads: the clean conditioning latent, the text caches, per-item action
    projections and raw-width masks, and the observation's mRoPE tables."""

    clean: Tensor                   # [B, C, 1, h, w] float32: latent frame 0, the condition
    cache: tfm.TextCache
    action_in: Tensor
    action_in_bias: Tensor
    action_out: Tensor
    action_out_bias: Tensor
    raw_mask: Tensor                # [B, 1, D] bool
    cos: Tensor                     # [R, G, head_dim] float32
    sin: Tensor


class Cosmos3Stages:
    """Weights, configs, settings and this rank's parallel place as the runner's stage API."""

    def __init__(self, transformer_weights: Dict[str, Tensor], vae_weights: Dict[str, Tensor],
                 tcfg: TransformerConfig, vcfg: VaeConfig, scfg: UniPCConfig, settings: Cosmos3Settings,
                 device, dtype: torch.dtype, parallel: Parallel = SINGLE, token_bucket: int = 0):
        self.w, self.vw = transformer_weights, vae_weights
        self.cfg, self.vcfg, self.scfg, self.settings = tcfg, vcfg, scfg, settings
        self.device, self.dtype = torch.device(device), dtype
        self.parallel = parallel
        self.passes = parallel.passes(settings.cfg)
        self.token_bucket = int(token_bucket)
        self.timesteps, self.sigmas, self.plan = unipc_plan(scfg, settings.num_steps)
        with torch.no_grad():
            self.temb = tfm.time_embedding(self.w, tcfg, torch.from_numpy(self.timesteps))     # [N, hidden] fp32
        self.latent_mean = torch.tensor(vcfg.latents_mean, dtype=torch.float32, device=self.device).view(1, -1, 1, 1, 1)
        self.latent_inv_std = (1.0 / torch.tensor(vcfg.latents_std, dtype=torch.float32)).to(self.device).view(
            1, -1, 1, 1, 1)

    # ---------------------------------------------------------------- host side
    def rows(self, inputs: Cosmos3Inputs) -> List[List[int]]:
        """Token ids of this rank's rows: per pass (cond, uncond), every batch item."""
        return [ids for p in self.passes for ids in (inputs.cond_ids if p == "cond" else inputs.uncond_ids)]

    def observation(self, inputs: Cosmos3Inputs) -> Dict[str, Tensor]:
        c, lay, dev = self.cfg, inputs.layout, self.device
        rows = self.rows(inputs)
        lens = torch.tensor([len(r) for r in rows])
        pad = int(lens.max())
        if self.token_bucket > 0:
            pad = -(-pad // self.token_bucket) * self.token_bucket
        ids = torch.zeros(len(rows), pad, dtype=torch.long)
        text_cos, text_sin, gen_cos, gen_sin = [], [], [], []
        for r, row in enumerate(rows):
            ids[r, :len(row)] = torch.tensor(row, dtype=torch.long)
            pos = position_ids(c, len(row), lay, inputs.settings.fps, self.vcfg.scale_factor_temporal)
            text = torch.arange(pad, dtype=torch.float32).unsqueeze(0).expand(3, -1)   # padding continues 0..pad-1
            cos, sin = mrope_cos_sin(c, torch.cat([text, pos[:, len(row):]], dim=1))
            text_cos.append(cos[:pad]), text_sin.append(sin[:pad]), gen_cos.append(cos[pad:]), gen_sin.append(sin[pad:])
        raw = torch.arange(c.action_dim)[None, None] < torch.tensor(inputs.raw_dims)[:, None, None]
        obs = {"frames": inputs.frames, "ids": ids, "text_cos": torch.stack(text_cos), "text_sin": torch.stack(text_sin),
               "gen_cos": torch.stack(gen_cos), "gen_sin": torch.stack(gen_sin),
               "domain": torch.tensor(inputs.domain_ids, dtype=torch.long), "raw_mask": raw,
               "causal": tfm.causal_mask(pad, "cpu")}
        mask = tfm.gen_mask(lens, pad, lay.tokens)
        if mask is not None:
            obs["gen_mask"] = mask
        return {k: v.to(dev) for k, v in obs.items()}

    def noise_shapes(self, obs: Dict[str, Tensor], layout: GenLayout) -> Tuple[tuple, tuple]:
        b = obs["domain"].shape[0]
        return (b, self.cfg.latent_channel, layout.frames, layout.height, layout.width), \
            (b, layout.chunk, self.cfg.action_dim)

    # ---------------------------------------------------------------- capture-safe stages
    def encode(self, frames: Tensor, layout: GenLayout) -> Tensor:
        """Canvas frames [B, 3, Hc, Wc] -> the normalized latent of frame 0 [B, C, 1, h, w], cropped to the
        content: the one latent frame the denoising reads (``initial_latents``). The pipeline encodes the frame
        repeated over the whole clip ((T - 1) x 4 + 1 frames); the encoder is causal in time, so latent frame 0
        depends on video frame 0 alone and encoding that frame gives it with 1 / 33 of the work at 9 latent
        frames (test_cosmos3_parity checks it against the pipeline's full-clip latent)."""
        mu = vae_mod.encode(self.vw, self.vcfg, frames.to(self.dtype)[:, :, None]).float()
        latent = (mu - self.latent_mean) * self.latent_inv_std
        return self.parallel.broadcast(latent[..., :layout.height, :layout.width].contiguous())

    def text_key(self, inputs: Cosmos3Inputs) -> tuple:
        """What ``text`` depends on: this rank's prompt rows (their ids; the padding is the bucket's shape). Equal
        keys in one bucket give equal keys / values, so a runner may keep them."""
        return tuple(tuple(r) for r in self.rows(inputs))

    def text(self, obs: Dict[str, Tensor]) -> Tuple[List[Tensor], List[Tensor]]:
        """The text pathway's per-layer keys / values of every row (they never read a generation token)."""
        return tfm.text_kv(self.w, self.cfg, obs["ids"], obs["text_cos"], obs["text_sin"], obs["causal"],
                           self.parallel.reduce)

    def condition(self, obs: Dict[str, Tensor], layout: GenLayout,
                  text: Optional[Tuple[List[Tensor], List[Tensor]]] = None) -> Context:
        """The observation's context; ``text``: ``self.text(obs)`` when already computed (else computed here)."""
        w = self.w
        keys, values = text if text is not None else self.text(obs)
        dom = obs["domain"]
        return Context(self.encode(obs["frames"], layout), tfm.TextCache(keys, values, obs.get("gen_mask")),
                       w["action_in"].index_select(0, dom), w["action_in_bias"].index_select(0, dom),
                       w["action_out"].index_select(0, dom), w["action_out_bias"].index_select(0, dom),
                       obs["raw_mask"], obs["gen_cos"], obs["gen_sin"])

    def initial_latents(self, ctx: Context, vision_noise: Tensor, action_noise: Tensor) -> Tuple[Tensor, Tensor]:
        """Frame 0 from the conditioning latent (one frame, broadcast over T by the mask), the other frames
        noise (the pipeline's mask blend); action noise with the columns past the raw width zeroed."""
        t = vision_noise.shape[2]
        m = torch.zeros(t, 1, 1, device=vision_noise.device)
        m[0] = 1.0
        vision = m * ctx.clean + (1.0 - m) * vision_noise
        actions = torch.where(ctx.raw_mask, action_noise, torch.zeros((), device=action_noise.device))
        return vision, actions

    def velocity(self, ctx: Context, vision: Tensor, actions: Tensor, step: int, layout: GenLayout,
                 trace: Optional[dict] = None) -> Tuple[Tensor, Tensor]:
        """The guided velocities (vision, action) at this step, as every rank ends up holding them."""
        w, c = self.w, self.cfg
        tokens = tfm.gen_tokens(w, c, vision, actions, self.temb[step], ctx.action_in, ctx.action_in_bias,
                                layout.frame_tokens)
        rows = tokens.repeat(len(self.passes), 1, 1) if len(self.passes) > 1 else tokens
        hidden = tfm.gen_hidden(w, c, rows, ctx.cos, ctx.sin, ctx.cache, self.parallel.reduce)
        n = len(self.passes)
        out_w = ctx.action_out.repeat(n, 1, 1) if n > 1 else ctx.action_out
        out_b = ctx.action_out_bias.repeat(n, 1) if n > 1 else ctx.action_out_bias
        v_vis, v_act = tfm.velocities(w, c, hidden, tuple(vision.shape), layout.frame_tokens, out_w, out_b)
        if self.parallel.cfg_size > 1:
            b = vision.shape[0]
            flat = self.parallel.gather_passes(torch.cat([v_vis.reshape(b, -1), v_act.reshape(b, -1)], dim=1))
            v_vis, v_act = flat[:, :v_vis[0].numel()].reshape(2 * b, *v_vis.shape[1:]), \
                flat[:, v_vis[0].numel():].reshape(2 * b, *v_act.shape[1:])
        if trace is not None:
            _record(trace, step, v_vis, v_act, vision.shape[0], self.settings.cfg)
        raw = ctx.raw_mask.repeat(v_act.shape[0] // ctx.raw_mask.shape[0], 1, 1)
        v_act = torch.where(raw, v_act, torch.zeros((), device=v_act.device))
        if not self.settings.cfg:
            return v_vis, v_act
        b, g = vision.shape[0], self.settings.guidance
        return v_vis[b:] + g * (v_vis[:b] - v_vis[b:]), v_act[b:] + g * (v_act[:b] - v_act[b:])

    def loop(self, ctx: Context, vision_noise: Tensor, action_noise: Tensor, layout: GenLayout,
             trace: Optional[dict] = None) -> Tuple[Tensor, Tensor]:
        """Every denoising step -> (actions [B, chunk, action_dim] float32, raw-width columns only non-zero,
        final vision latents [B, C, T, h, w])."""
        vision, actions = self.initial_latents(ctx, vision_noise, action_noise)
        sv, sa = UniPCState(self.plan, self.scfg.solver_order), UniPCState(self.plan, self.scfg.solver_order)
        zero = torch.zeros((), device=actions.device)
        for i in range(len(self.plan)):
            if trace is not None:
                trace.setdefault("vision_latents", []).append(vision.clone())
                trace.setdefault("action_latents", []).append(actions.clone())
            v_vis, v_act = self.velocity(ctx, vision, actions, i, layout, trace)
            vision = sv.step(i, vision, v_vis)
            actions = torch.where(ctx.raw_mask, sa.step(i, actions, v_act), zero)
        if trace is not None:
            trace["vision_latents"].append(vision.clone())
            trace["action_latents"].append(actions.clone())
        return actions, vision


def _record(trace: dict, step: int, v_vis: Tensor, v_act: Tensor, b: int, cfg_on: bool) -> None:
    """Raw (unmasked) velocities per pass: action every step, vision at step 0 (what the fixtures keep)."""
    passes = ("cond", "uncond") if cfg_on else ("cond",)
    for k, p in enumerate(passes):
        trace.setdefault(f"{p}_action_velocity_raw", []).append(v_act[k * b:(k + 1) * b].clone())
        if step == 0:
            trace[f"{p}_vision_velocity_raw_step0"] = v_vis[k * b:(k + 1) * b].clone()


__all__ = ["Cosmos3Stages", "Cosmos3Inputs", "Context"]
