"""The toy family's adapter: a small flow policy (per-camera image features, a byte-level task embedding and the
state as its observation; an MLP velocity field; 4 Euler steps) that keeps the whole model contract
(phyai_ros/models/contract.py) and samples through its own runner, built on the runtime's runner interface
(phyai_ros/runtime/runner.py) alone: how a new family brings its stage order without touching a shared file.

Checkpoint folder: ``config.json`` ({"type": "toy_flow", sizes, cameras}) and ``model.safetensors``; a quantized
one adds ``quantization.json`` (phyai_ros/models/quantized_checkpoint.py's format) with its MLP weights as
``<name>.q`` / ``<name>.scale``.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

import numpy as np
import torch
import torch.nn.functional as F

from phyai_ros.layers import dispatch
from phyai_ros.layers.quantized import QuantizedWeight
from phyai_ros.models.cases import InputError
from phyai_ros.models.contract import (NO_FILES, NO_OPTIONS, ModelFiles, PolicyAdapter, QuantizeRequest,
                                       QuantizeResult)
from phyai_ros.models.files import CheckpointError, read_json, read_safetensors_file, validate_keys
from phyai_ros.models.quantized_checkpoint import (copy_source_files, read_manifest, save_weights, summary,
                                                   write_manifest)
from phyai_ros.runtime.runner import Runner

TYPE = "toy_flow"
MLP = ("in_w", "hid_w", "out_w")   # the weights the quantizer takes (part "expert": they run at every step)


@dataclass(frozen=True)
class ToyConfig:
    horizon: int = 20
    state_dim: int = 8
    action_dim: int = 7
    cameras: tuple = ("base_0_rgb",)
    width: int = 32
    steps: int = 4
    image_size: int = 8          # frames are squashed to this square, then averaged per channel block
    vocab: int = 256             # task bytes
    tokens: int = 16             # task bytes kept

    def shapes(self) -> Dict[str, tuple]:
        w, ha = self.width, self.horizon * self.action_dim
        return {"img_w": (w, 3 * self.image_size ** 2), "tok_emb": (self.vocab, w), "state_w": (w, self.state_dim),
                "in_w": (w, ha), "hid_w": (w, w), "out_w": (ha, w)}


class ToyModel:
    """The toy's stages over a weight dict: the observation's context once, the velocity at every step."""

    def __init__(self, cfg: ToyConfig, weights: Dict[str, torch.Tensor], device="cpu"):
        self.cfg, self.w, self.device = cfg, weights, torch.device(device)

    def embed_images(self, images):
        b, s = images.shape[:2]
        return dispatch.linear(images.reshape(b, s, -1), self.w["img_w"])            # [B, S, W]

    def join_prefix(self, image_embs, image_masks, tokens, token_masks):
        tok = F.embedding(tokens, self.w["tok_emb"])                                  # [B, L, W]
        return torch.cat([image_embs, tok], dim=1), torch.cat([image_masks, token_masks], dim=1)

    def prefix_state(self, embs, pad, state):
        m = pad.to(embs.dtype)[..., None]
        ctx = (embs * m).sum(1) / m.sum(1).clamp(min=1.0)
        return ctx + dispatch.linear(state[:, :self.cfg.state_dim], self.w["state_w"])

    def step_tables(self, t_table):
        """A sinusoidal embedding of each step's flow time [steps, width]."""
        half = self.cfg.width // 2
        periods = 4e-3 * (4.0 / 4e-3) ** torch.linspace(0, 1, half, device=t_table.device)
        angle = t_table.reshape(-1, 1) * (2 * np.pi / periods)
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1)

    def context(self, images, image_masks, tokens, token_masks, state):
        return self.prefix_state(*self.join_prefix(self.embed_images(images), image_masks, tokens, token_masks), state)

    def velocity(self, x, ctx, table):
        b = x.shape[0]
        h = F.gelu(dispatch.linear(x.reshape(b, -1), self.w["in_w"]) + ctx + table)
        h = F.gelu(dispatch.linear(h, self.w["hid_w"]))
        return dispatch.linear(h, self.w["out_w"]).reshape(x.shape)


@dataclass
class ToyBucket:
    """One (batch, camera slots, tokens) shape: its static inputs and its two stages' calls."""

    key: tuple
    inputs: tuple
    noise: torch.Tensor
    context: object = None
    loop: object = None
    observation_for: Optional[int] = None


class ToyRunner(Runner):
    """Context once per observation, then the Euler loop, each a captured stage per bucket under CUDA graphs."""

    stages = ("context", "loop")

    def __init__(self, model: ToyModel, use_graphs: bool = False):
        super().__init__(model.device, use_graphs)
        self.model, self.steps = model, model.cfg.steps
        self.dt = -1.0 / self.steps
        self.tables = model.step_tables(torch.tensor([1.0 + k * self.dt for k in range(self.steps)],
                                                     device=self.device))

    def loop(self, ctx, noise):
        x = noise
        for k in range(self.steps):
            x = x + self.dt * self.model.velocity(x, ctx, self.tables[k])
        return x

    @torch.no_grad()
    def set_observation(self, images, image_masks, tokens, token_masks, state) -> ToyBucket:
        inputs = (images, image_masks, tokens, token_masks, state)
        key = (images.shape[0], images.shape[1], tokens.shape[1])
        b = self._buckets.get(key)
        if b is None:
            b = ToyBucket(key, tuple(torch.empty_like(v, device=self.device) for v in inputs),
                          torch.zeros(images.shape[0], self.model.cfg.horizon, self.model.cfg.action_dim,
                                      device=self.device))
            self._buckets.add(key, b)
        for buf, value in zip(b.inputs, inputs):
            buf.copy_(value)
        b.context = self.run_stage(key, "context", self.model.context, b.inputs, b.context)
        b.observation_for = self.new_observation()
        return b

    @torch.no_grad()
    def sample(self, bucket: ToyBucket, noise) -> torch.Tensor:
        if bucket.observation_for is None:
            raise RuntimeError("no observation: call set_observation() first")
        bucket.noise.copy_(noise)
        bucket.loop = self.run_stage(bucket.key, "loop", self.loop, (bucket.context.outputs, bucket.noise),
                                     bucket.loop)
        return bucket.loop.outputs


@dataclass
class ToyInputs:
    images: torch.Tensor
    image_masks: torch.Tensor
    tokens: torch.Tensor
    token_masks: torch.Tensor
    state: torch.Tensor


class ToyFlowAdapter(PolicyAdapter):
    family = "toy_flow"
    checkpoint_types = (TYPE,)
    rtc_modes = ("off",)
    needs_files = ()
    masks_cameras = True
    serving = "single"

    def __init__(self, cfg: ToyConfig, weights: Dict[str, object], device="cpu"):
        self.cfg = cfg
        self.camera_names = list(cfg.cameras)
        self.model = ToyModel(cfg, weights, device)
        self.use_runner()

    # ------------------------------------------------------------ loading
    @classmethod
    def load(cls, checkpoint, files: ModelFiles = NO_FILES, camera_names: Optional[Sequence[str]] = None,
             device="cpu", dtype: torch.dtype = torch.float32,
             options: Mapping[str, str] = NO_OPTIONS) -> "ToyFlowAdapter":
        cls.check_options(options)
        cls.check_files(files)
        folder = Path(checkpoint)
        raw = read_json(folder / "config.json")
        if raw.get("type") != TYPE:
            raise CheckpointError(f"{folder}: config.json type {raw.get('type')!r}, not {TYPE!r}")
        cfg = ToyConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items() if k != "type"})
        if camera_names is not None and not set(camera_names) <= set(cfg.cameras):
            raise ValueError(f"camera_names {list(camera_names)} must be a subset of {list(cfg.cameras)}")
        sd = read_safetensors_file(folder / "model.safetensors")
        manifest = read_manifest(folder)
        weights: Dict[str, object] = {}
        for name in cfg.shapes():
            if manifest is not None and name in manifest["layers"]:
                weights[name] = QuantizedWeight.from_tensors(manifest["scheme_obj"], sd.pop(name + ".q"),
                                                             sd.pop(name + ".scale"))
            elif name in sd:
                weights[name] = sd.pop(name).to(dtype)
        validate_keys({k: w for k, w in weights.items() if not isinstance(w, QuantizedWeight)},
                      {k: s for k, s in cfg.shapes().items() if not isinstance(weights.get(k), QuantizedWeight)})
        return cls(cfg, {k: w.to(device) for k, w in weights.items()}, device)

    # ------------------------------------------------------------ facts
    @property
    def state_dim(self) -> int:
        return self.cfg.state_dim

    @property
    def action_dim(self) -> int:
        return self.cfg.action_dim

    @property
    def chunk_size(self) -> int:
        return self.cfg.horizon

    def quantization(self) -> str:
        return summary(self.model.w, lambda name: "expert" if name in MLP else None)

    # ------------------------------------------------------------ the bridge's API
    def make_noise(self, batch: int, generator=None) -> torch.Tensor:
        return torch.randn(batch, self.cfg.horizon, self.cfg.action_dim, generator=generator)

    def fit_task(self, task: str, state=None):
        data = task.encode()
        return data[:self.cfg.tokens].decode(errors="ignore"), len(data) > self.cfg.tokens

    def use_runner(self, use_graphs: bool = False, token_bucket: int = 0) -> ToyRunner:
        self.runner = ToyRunner(self.model, use_graphs=use_graphs)
        return self.runner

    def capture_buckets(self, images, state, eager: bool = False, min_cameras: Optional[int] = None) -> list:
        if not self.runner.use_graphs and not eager:
            return []
        x = self.prepare(images, np.asarray(state, np.float32)[None], ["warm up"])
        self.runner.warm_up(lambda: self.sample(x, self.make_noise(1)))
        return self.runner.buckets()

    def prepare(self, images, state, tasks) -> ToyInputs:
        state = torch.as_tensor(np.asarray(state, np.float32))
        if state.dim() != 2 or state.shape[1] != self.cfg.state_dim or not bool(torch.isfinite(state).all()):
            raise ValueError(f"state must be finite [B, {self.cfg.state_dim}], got {list(state.shape)}")
        b, s = state.shape[0], self.cfg.image_size
        present = {k: v for k, v in images.items() if v is not None}
        if not present or not set(present) <= set(self.camera_names):
            raise ValueError(f"cameras {sorted(present)}: give at least one of {self.camera_names}")
        slots, masks = [], []
        for name in self.camera_names:
            if name in present:
                img = torch.as_tensor(np.asarray(present[name]))
                if img.dtype != torch.uint8 or img.shape[-1] != 3:
                    raise ValueError(f"camera '{name}': expected uint8 RGB, got {img.dtype} {list(img.shape)}")
                img = img.reshape(-1, *img.shape[-3:]).permute(0, 3, 1, 2).float() / 255
                slots.append(F.interpolate(img, size=(s, s), mode="area").expand(b, -1, -1, -1))
            else:
                slots.append(torch.zeros(b, 3, s, s))
            masks.append(name in present)
        tokens = torch.zeros(b, self.cfg.tokens, dtype=torch.long)
        token_masks = torch.zeros(b, self.cfg.tokens, dtype=torch.bool)
        for i, task in enumerate(tasks):
            data = list(self.fit_task(task)[0].encode())
            tokens[i, :len(data)] = torch.tensor(data, dtype=torch.long)
            token_masks[i, :len(data)] = True
        return ToyInputs(torch.stack(slots, 1), torch.tensor([masks] * b), tokens, token_masks, state)

    def sample(self, x: ToyInputs, noise) -> torch.Tensor:
        if noise is None or isinstance(noise, torch.Generator):
            noise = self.make_noise(x.state.shape[0], generator=noise)
        dev = self.model.device
        bucket = self.runner.set_observation(x.images.to(dev), x.image_masks.to(dev), x.tokens.to(dev),
                                             x.token_masks.to(dev), x.state.to(dev))
        return self.runner.sample(bucket, torch.as_tensor(noise, dtype=torch.float32).to(dev).reshape(
            -1, self.cfg.horizon, self.cfg.action_dim))

    def predict(self, images, state, task, noise=None, rtc=None) -> np.ndarray:
        if rtc is not None:
            raise ValueError("the toy family does RTC 'off' only")
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task must be a non-empty string, got {task!r}")
        x = self.prepare(images, np.asarray(state, np.float32)[None], [task])
        return self.sample(x, noise)[0].detach().cpu().numpy()

    # ------------------------------------------------------------ tools
    def case_runner(self, case, noise):
        if case.rtc or case.inference_delay is not None:
            raise InputError("the toy family does RTC 'off' only")

        def infer():
            x = self.prepare(case.images, case.state.numpy(), case.tasks)
            actions = self.sample(x, noise).clone()
            return {"actions": actions, "actions.model": actions}, {"tasks": case.tasks}
        return infer

    @classmethod
    def quantize(cls, request: QuantizeRequest) -> QuantizeResult:
        """The MLP (part "expert") quantized; everything else kept in float."""
        if request.scheme.activations == "static":
            raise ValueError("the toy family calibrates no static activation scales")
        src = Path(request.checkpoint)
        sd = read_safetensors_file(src / "model.safetensors")
        layers = [n for n in MLP if "expert" in request.parts]
        state = {k: v for k, v in sd.items() if k not in layers}
        for name in layers:
            q = QuantizedWeight.from_float(sd[name].to(request.dtype), request.scheme)
            state.update({f"{name}.{k}": t for k, t in q.state_dict().items()})
        copy_source_files(src, Path(request.output), ("model.safetensors",))
        save_weights(state, Path(request.output) / "model.safetensors")
        write_manifest(Path(request.output), src, TYPE, request.scheme, request.parts, layers, [],
                       str(request.dtype).replace("torch.", ""))
        return QuantizeResult(Path(request.output), layers, [])

    @classmethod
    def make_small_checkpoint(cls, directory, *, fixtures=None, horizon: int = 20, state_dim: int = 8,
                              action_dim: int = 7, cameras: Sequence[str] = ("base_0_rgb", "left_wrist_0_rgb",
                                                                             "right_wrist_0_rgb"),
                              seed: int = 0) -> Path:
        cfg = ToyConfig(horizon, state_dim, action_dim, tuple(cameras))
        folder = Path(directory)
        folder.mkdir(parents=True, exist_ok=True)
        gen = torch.Generator().manual_seed(seed)
        save_weights({k: torch.randn(s, generator=gen) / s[-1] ** 0.5 for k, s in cfg.shapes().items()},
                     folder / "model.safetensors")
        (folder / "config.json").write_text(json.dumps({"type": TYPE, **asdict(cfg)}, indent=1))
        return folder
