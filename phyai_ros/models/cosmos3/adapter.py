"""Cosmos3 policy adapter (the registry's "cosmos3"): camera image + instruction + embodiment domain in, action chunk
out, and the family's side of the model contract (phyai_ros/models/contract.py).

    policy = Cosmos3Adapter.from_files(pipeline_dir, device="cuda", dtype=torch.bfloat16,
                                      settings=Cosmos3Settings(num_steps=4, guidance=3.0, chunk_size=32,
                                                               domain="droid_lerobot"))
    actions = policy.predict(images={"image": rgb_uint8_HxWx3}, state=None, task="pick up the cup")
    # -> np.float32 [chunk_size, raw action width of the domain], in the model's normalized action space

Stage order (what the runner drives, phyai_ros/models/cosmos3/runner.py): `prepare` (canvas, caption, token
ids of both guidance passes: host side) -> conditioning (VAE encode of the conditioning frame, the text
pathway's keys / values: once per observation) -> the denoising loop (video and action latents together,
UniPC, classifier-free guidance) -> the actions cropped to the domain's raw width.

- images: camera name -> uint8 [H, W, 3] (or [B, H, W, 3]); with several `camera_names` the frames are put
  side by side in that order (same height required; the view point should then be "concat_view").
- state: policy mode reads no robot state (diffusers' pipeline has no such input); it is accepted and ignored
  so the node's call is the same for every family (`state_dim` is 0).
- Actions are what the pipeline returns: the model's normalized action space, no de-normalization, the
  domain's raw width (diffusers' table, not the model's action_dim). RTC: none (`rtc_modes` = ("off",)).
- Settings (steps, guidance, chunk, fps, tier, view point, domain, negative prompt) are parameters; the
  scheduler config, tokenizer and chat template come from the checkpoint folder. Loaded through the contract
  (the node, predict, the serve engine) it runs ``Cosmos3Settings``' defaults, the embodiment domain from
  ``model.embodiment``; a fixture case runs its own settings (``case_runner``).
- Noise: its shape follows the image's canvas, so the shared tools pass a generator (or None) and the
  adapter draws the pipeline's noise after ``prepare``.
"""
from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Dict, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from phyai_ros.layers.quantized import QuantScheme, quantized_in
from phyai_ros.models.cases import InputError
from phyai_ros.models.contract import NO_FILES, NO_OPTIONS, CaseInfer, ModelFiles, PolicyAdapter, PredictCase
from phyai_ros.models.files import read_json
from phyai_ros.models.quantized_checkpoint import summary
from phyai_ros.models.cosmos3.runner import Cosmos3Runner

from . import transformer as tfm
from .canvas import canvas_frame, check_image
from .cases import case_entry, case_inputs, case_settings
from .checkpoint import (PIPELINE_CLASS, Cosmos3Checkpoint, load_cosmos3_checkpoint, load_transformer_weights,
                         load_vae_weights, write_random_checkpoint)
from .config import Cosmos3Settings, TransformerConfig, VaeConfig, latent_frames_of_chunk
from .layout import GenLayout
from .parallel import SINGLE, Parallel
from .prompt import ChatTokenizer, domain, prompt_ids
from .stages import Cosmos3Inputs, Cosmos3Stages

Tensor = torch.Tensor
Noise = Tuple[Tensor, Tensor]          # (vision [B, C, T, h, w], action [B, chunk, action_dim]), float32


# model.options keys -> the Cosmos3Settings field they set (the domain is model.embodiment's)
OPTIONS = {"num_steps": int, "guidance": float, "chunk_size": int, "fps": float, "resolution_tier": int,
           "view_point": str, "negative_prompt": str, "max_prompt_tokens": int, "quantization": str}


def settings_from_options(options: Mapping[str, str]) -> Cosmos3Settings:
    """``model.options`` -> settings (the defaults for what is not given); an unknown key or a bad value is a
    ValueError naming it."""
    unknown = sorted(set(options) - set(OPTIONS))
    if unknown:
        raise ValueError(f"model options {unknown} are not Cosmos3's (it takes {', '.join(OPTIONS)})")
    values = {}
    for key, text in options.items():
        try:
            values[key] = OPTIONS[key](text)
        except ValueError:
            raise ValueError(f"model option {key}={text!r}: expected {OPTIONS[key].__name__}") from None
    return replace(Cosmos3Settings(), **values)


class Cosmos3Adapter(PolicyAdapter):
    family = "cosmos3"
    checkpoint_types = (PIPELINE_CLASS,)
    rtc_modes = ("off",)
    needs_files = ()
    masks_cameras = False
    serving = "single"                 # one canvas per batch: requests are run one by one
    embodiments = True                 # the embodiment domain
    image_size = None                  # any aspect: the canvas is chosen per image
    expected_keys = {"actions": "final_action"}

    def __init__(self, ckpt: Cosmos3Checkpoint, settings: Optional[Cosmos3Settings] = None, device="cpu",
                 dtype: torch.dtype = torch.float32, parallel: Parallel = SINGLE,
                 camera_names: Sequence[str] = ("image",), token_bucket: int = 0):
        self.ckpt, self.parallel = ckpt, parallel
        self.device, self.dtype = torch.device(device), dtype
        self.config, self.vae_config = ckpt.transformer, ckpt.vae
        self.tokenizer = ChatTokenizer(ckpt.tokenizer_dir)
        if self.tokenizer.vocab_size > self.config.vocab_size:
            raise ValueError(f"{ckpt.tokenizer_dir}: the tokenizer has {self.tokenizer.vocab_size} ids, the "
                             f"transformer's table {self.config.vocab_size}")
        self.camera_names = list(camera_names)
        if not self.camera_names or len(set(self.camera_names)) != len(self.camera_names):
            raise ValueError(f"camera_names must be distinct and non-empty, got {camera_names!r}")
        self.transformer_weights = load_transformer_weights(ckpt, dtype, self.device, parallel.tp_rank,
                                                            parallel.tp_size)
        self.vae_weights = load_vae_weights(ckpt, dtype, self.device)
        self.ckpt = replace(ckpt, transformer_weights={}, vae_weights={})   # the loaded copies are all it needs
        self._quantized: Optional[str] = None
        self._apply_settings(settings or Cosmos3Settings(), use_graphs=False, token_bucket=token_bucket)

    @classmethod
    def matches(cls, checkpoint) -> bool:
        """A saved Cosmos3OmniPipeline folder: its model_index.json names the pipeline class (no config.json)."""
        index = Path(checkpoint) / "model_index.json"
        return index.is_file() and read_json(index).get("_class_name") == PIPELINE_CLASS

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        settings_from_options(options)

    @classmethod
    def load(cls, checkpoint, files: ModelFiles = NO_FILES, camera_names: Optional[Sequence[str]] = None,
             device="cpu", dtype: torch.dtype = torch.float32,
             options: Mapping[str, str] = NO_OPTIONS) -> "Cosmos3Adapter":
        """The tools' call: the robot's cameras (side by side, in this order); ``options``: Cosmos3Settings fields
        (num_steps, guidance, chunk_size, fps, resolution_tier, view_point, negative_prompt), the rest defaults."""
        cls.check_files(files)
        return cls.from_files(checkpoint, camera_names=camera_names, device=device, dtype=dtype,
                              settings=settings_from_options(options))

    @classmethod
    def from_files(cls, checkpoint_dir, tokenizer=None, norm_stats=None, camera_names: Optional[Sequence[str]] = None,
                   device="cpu", dtype: torch.dtype = torch.float32, settings: Optional[Cosmos3Settings] = None,
                   parallel: Parallel = SINGLE, token_bucket: int = 0) -> "Cosmos3Adapter":
        """Load a Cosmos3OmniPipeline folder (its tokenizer and scheduler are read from it: `tokenizer` and
        `norm_stats` exist for the registry's common signature and must be None)."""
        if tokenizer is not None or norm_stats is not None:
            raise ValueError("a Cosmos3 checkpoint folder carries its own tokenizer and has no normalization stats")
        return cls(load_cosmos3_checkpoint(checkpoint_dir), settings or Cosmos3Settings(), device, dtype, parallel,
                   camera_names or ("image",), token_bucket)

    # ---------------------------------------------------------------- interface facts
    @property
    def state_dim(self) -> int:
        return 0

    @property
    def action_dim(self) -> int:
        return self.domain.raw_dim

    @property
    def chunk_size(self) -> int:
        return self.settings.chunk_size

    @property
    def token_budget(self) -> int:
        return self.settings.max_prompt_tokens

    def select_embodiment(self, value: str) -> None:
        """Act as embodiment domain `value` (a name of the domain table that fits this model)."""
        self.domain = domain(str(value).strip(), self.config.action_dim, self.config.num_domains)

    def use_settings(self, settings: Cosmos3Settings) -> None:
        """Run with other settings (steps, guidance, chunk, domain, ...): the same weights, new stages and runner."""
        self._apply_settings(settings, self.runner.use_graphs, self.stages.token_bucket)

    def _apply_settings(self, settings: Cosmos3Settings, use_graphs: bool, token_bucket: int) -> None:
        """What the settings decide (the domain, the chunk's latent frames, the stages, a fresh runner), for the
        constructor and ``use_settings`` alike; nothing is changed unless all of it fits the checkpoint."""
        dom = domain(settings.domain, self.config.action_dim, self.config.num_domains)
        latent_frames = latent_frames_of_chunk(settings.chunk_size, self.vae_config)
        if settings.quantization != self._quantized:
            if self._quantized is not None:
                raise ValueError(f"the weights were quantized ({self._quantized}) when the policy was loaded; "
                                 "load it again for another quantization")
            self.transformer_weights = tfm.quantize_generation(self.transformer_weights, self.config,
                                                               QuantScheme.make(settings.quantization))
            self._quantized = settings.quantization
        stages = Cosmos3Stages(self.transformer_weights, self.vae_weights, self.config, self.vae_config,
                               self.ckpt.scheduler, settings, self.device, self.dtype, self.parallel, token_bucket)
        self.settings, self.domain, self.latent_frames, self.stages = settings, dom, latent_frames, stages
        self.runner = Cosmos3Runner(stages, use_graphs=use_graphs)

    def quantization(self) -> str:
        return summary(self.transformer_weights, tfm.quantized_part)

    def quantized_weights(self) -> list:
        return quantized_in(self.transformer_weights)

    def use_runner(self, use_graphs: bool = True, token_bucket: int = 0) -> Cosmos3Runner:
        """Sample through a fresh runner (CUDA graphs on a CUDA device when use_graphs)."""
        self.stages.token_bucket = int(token_bucket)
        self.runner = Cosmos3Runner(self.stages, use_graphs=use_graphs)
        return self.runner

    # ---------------------------------------------------------------- stages
    def conditioning_frames(self, images: Mapping[str, object]) -> List[np.ndarray]:
        """camera -> uint8 [H, W, 3], [B, H, W, 3] or a list of [H, W, 3] -> per item one [H, W', 3] frame
        (several cameras side by side, in `camera_names` order)."""
        missing = [c for c in self.camera_names if images.get(c) is None]
        if missing:
            raise ValueError(f"missing camera image(s) {missing}; this policy reads {self.camera_names}")
        per_camera = []
        for c in self.camera_names:
            v = images[c]
            if isinstance(v, (list, tuple)):
                items = [check_image(i) for i in v]
            else:
                a = v.numpy() if isinstance(v, Tensor) else np.asarray(v)
                items = [check_image(i) for i in (a[None] if a.ndim == 3 else a)]
            per_camera.append(items)
        if len({len(items) for items in per_camera}) != 1:
            raise ValueError(f"cameras {self.camera_names} differ in batch size: {[len(i) for i in per_camera]}")
        frames = []
        for item in zip(*per_camera):
            if len({f.shape[0] for f in item}) != 1:
                raise ValueError(f"cameras {self.camera_names} differ in height: {[list(f.shape) for f in item]}")
            frames.append(np.concatenate(item, axis=1) if len(item) > 1 else item[0])
        return frames

    def prepare(self, images: Mapping[str, object], tasks: Union[str, Sequence[str]],
                domain_name: Optional[str] = None) -> Cosmos3Inputs:
        """Raw batch -> prepared inputs: canvas frames (all items on one canvas), both passes' token ids."""
        s = self.settings
        frames = self.conditioning_frames(images)
        batch = len(frames)
        tasks = [tasks] * batch if isinstance(tasks, str) else tasks
        if not isinstance(tasks, (list, tuple)) or not all(isinstance(t, str) for t in tasks):
            raise ValueError(f"tasks must be text or a list of texts, got {type(tasks).__name__}")
        if len(tasks) != batch:
            raise ValueError(f"{len(tasks)} tasks for a batch of {batch}")
        dom = self.domain if domain_name is None else domain(domain_name, self.config.action_dim,
                                                              self.config.num_domains)
        canv, pixels, cond, uncond, captions = None, [], [], [], []
        for frame, task in zip(frames, tasks):
            x, c = canvas_frame(frame, s.resolution_tier, self.vae_config.scale_factor_spatial)
            if canv is not None and c != canv:
                raise ValueError(f"batch items need one canvas: {c} vs {canv} (give images of one size)")
            canv = c
            ci, ui, cap = prompt_ids(self.tokenizer, task, s.negative_prompt, s.view_point, s.chunk_size + 1, s.fps,
                                     (c.height, c.width), self.ckpt.use_system_prompt, s.max_prompt_tokens)
            pixels.append(x), cond.append(ci), uncond.append(ui), captions.append(cap)
        layout = GenLayout(self.latent_frames, canv.latent_h, canv.latent_w, self.config.latent_patch_size,
                           s.chunk_size)
        return Cosmos3Inputs(torch.cat(pixels), canv, cond, uncond, [dom.id] * batch, [dom.raw_dim] * batch,
                             captions, layout, s)

    def make_noise(self, inputs: Cosmos3Inputs, generator: Optional[torch.Generator] = None) -> Noise:
        """Per item, the video noise (full latent shape, frame 0 included) then the action noise from one
        generator: the pipeline's draw order, so a seed gives the pipeline's noise at batch 1."""
        lay, c = inputs.layout, self.config
        vis, act = [], []
        for _ in range(inputs.batch):
            vis.append(torch.randn((1, c.latent_channel, lay.frames, lay.height, lay.width), generator=generator))
            act.append(torch.randn((1, lay.chunk, c.action_dim), generator=generator))
        return torch.cat(vis), torch.cat(act)

    def _noise(self, noise: Union[Noise, torch.Generator, None], inputs: Cosmos3Inputs) -> Noise:
        vshape, ashape = self.stages.noise_shapes({"domain": torch.zeros(inputs.batch)}, inputs.layout)
        if noise is None or isinstance(noise, torch.Generator):
            noise = self.make_noise(inputs, noise)
        vis, act = (torch.as_tensor(n, dtype=torch.float32) for n in noise)
        if tuple(vis.shape) != vshape or tuple(act.shape) != ashape:
            raise ValueError(f"noise: expected vision {list(vshape)} and action {list(ashape)}, got "
                             f"{list(vis.shape)} and {list(act.shape)}")
        if not (bool(torch.isfinite(vis).all()) and bool(torch.isfinite(act).all())):
            raise ValueError("noise holds NaN/Inf values")
        return vis.to(self.device), act.to(self.device)

    @torch.no_grad()
    def sample_actions(self, inputs: Cosmos3Inputs, noise: Optional[Noise] = None,
                       trace: Optional[Dict[str, object]] = None) -> Tensor:
        """-> actions [B, chunk, raw width] float32 (model space). trace (optional dict) receives the clean
        latent, position ids and per-step latents / raw velocities (an eager run)."""
        vis, act = self._noise(noise, inputs)
        obs = self.stages.observation(inputs)
        bucket = self.runner.set_observation(obs, inputs.layout, self.stages.text_key(inputs))
        actions, vision = self.runner.sample(bucket, vis, act, trace)
        if trace is not None:
            trace["clean_latent"] = bucket.context.clean.clone()
            trace["final_vision_latents"] = vision.clone()
        return actions[..., :inputs.raw_dims[0]].float().clone()    # prepare gives every item one domain

    def capture_buckets(self, images: Mapping[str, object], state=None, eager: bool = False,
                        min_cameras: Optional[int] = None) -> list:
        """Warm-up at start-up: one chunk at this camera shape, capturing its graphs when they are on (eager: the
        same shapes without graphs, for the operator autotune's recording)."""
        x = self.prepare(images, "warm up")
        vis, act = self._noise(None, x)
        runner = Cosmos3Runner(self.stages, use_graphs=False) if eager else self.runner
        runner.run(self.stages.observation(x), x.layout, vis, act)
        return list(runner.buckets())

    def fit_task(self, task: str, state=None) -> Tuple[str, bool]:
        """(the instruction, whether it was cut): an instruction whose prompt exceeds max_prompt_tokens is cut
        to the longest prefix (whole words where possible) that fits."""
        canvas = (self.settings.resolution_tier, self.settings.resolution_tier)     # the caption's size digits
        s = self.settings

        def fits(text: str) -> bool:
            try:
                prompt_ids(self.tokenizer, text, s.negative_prompt, s.view_point, s.chunk_size + 1, s.fps, canvas,
                           self.ckpt.use_system_prompt, s.max_prompt_tokens - 8)   # margin: canvas sizes vary
                return True
            except ValueError:
                return False
        if fits(task):
            return task, False
        lo, hi = 0, len(task)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            lo, hi = (mid, hi) if fits(task[:mid]) else (lo, mid - 1)
        cut = task[:lo]
        return (cut.rsplit(" ", 1)[0] if " " in cut else cut), True

    # ---------------------------------------------------------------- node API (batch 1)
    def predict(self, images: Mapping[str, object], state=None, task: str = "",
                noise: Union[Noise, torch.Generator, None] = None, rtc=None) -> np.ndarray:
        """One observation -> [chunk_size, raw action width] float32 (model space). state is not read. The
        noise's shape follows the image's canvas, so a caller that cannot make it beforehand passes a generator:
        it is drawn after `prepare`, in the pipeline's order."""
        if rtc is not None:
            raise ValueError("Cosmos3 has no real-time chunking (rtc_modes: off)")
        if not isinstance(task, str) or not task.strip():
            raise ValueError(f"task must be a non-empty string, got {task!r}")
        inputs = self.prepare(images, task)
        return self.sample_actions(inputs, noise)[0].cpu().numpy()

    # ---------------------------------------------------------------- tools
    def case_runner(self, case: PredictCase, noise) -> CaseInfer:
        """A case of the fixtures' layout (inputs.json ``cases``: its settings, instruction, domain; the inputs
        file: ``<case>.image_uint8`` and the noise the pipeline drew); actions [1, chunk, raw width]."""
        if not case.case:
            raise InputError("Cosmos3 cases are named: give --case (one of inputs.json's cases)")
        try:
            entry = case_entry(case.meta or {}, case.case)
            image, recorded = case_inputs(case.inputs, case.case)
            self.use_settings(case_settings(entry))
        except (KeyError, ValueError) as exc:
            raise InputError(f"--case {case.case}: {exc}") from None
        if case.rtc or case.inference_delay is not None:
            raise InputError("Cosmos3 has no real-time chunking")
        instruction = case.tasks[0] if case.tasks else entry.get("instruction", "")

        def infer():
            prepared = self.prepare({self.camera_names[0]: image}, instruction)
            actions = self.sample_actions(prepared, recorded)
            return {"actions": actions, "actions.model": actions}, {"case": case.case, "caption": prepared.captions}
        return infer

    @classmethod
    def make_small_checkpoint(cls, directory, *, fixtures: Optional[Path] = None, seed: int = 0) -> Path:
        """A tiny random pipeline folder (the fixtures' sizes, byte-level stand-in tokenizer); returns it."""
        t = TransformerConfig(hidden_size=32, head_dim=16, num_heads=4, num_kv_heads=2, intermediate_size=64,
                              num_layers=1, rope_axes_dim=(4, 2, 2), action_dim=12, vocab_size=272)
        v = VaeConfig(base_dim=8, dim_mult=(1, 1, 1, 1), num_res_blocks=1)
        return write_random_checkpoint(Path(directory), t, v, seed=seed, std=0.2)


__all__ = ["Cosmos3Adapter", "Cosmos3Settings", "Cosmos3Inputs"]
