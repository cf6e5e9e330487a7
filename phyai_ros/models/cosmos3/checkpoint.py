"""Cosmos3 checkpoint folders as diffusers 0.42.1 saves a Cosmos3OmniPipeline: model_index.json naming the
component folders, transformer/ and vae/ (config.json + diffusion_pytorch_model.safetensors, or shards with
their .index.json), scheduler/scheduler_config.json and text_tokenizer/ (tokenizer.json, tokenizer_config.json,
chat template).

Every file is read as hostile: JSON and safetensors errors name the file, every weight key and shape is
checked against the config at once (missing / unexpected / mis-shaped, one CheckpointError), NaN / Inf weights
are refused. Weights are read lazily per tensor (only what the policy uses: no lm_head, no VAE decoder), so a
tensor-parallel rank holds only its shard. `write_random_checkpoint` writes the same layout with random weights
at any size (tests, the benchmark's full-size model).
"""
from __future__ import annotations

import json
import math
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, Iterable, Mapping, Optional

import torch

from phyai_ros.models.files import CheckpointError, fixed_file, inside, read_json, require_finite, validate_keys

from . import transformer as tfm
from . import vae as vae_mod
from .config import TransformerConfig, VaeConfig
from .unipc import UniPCConfig

PIPELINE_CLASS = "Cosmos3OmniPipeline"   # model_index.json's _class_name of a saved pipeline folder
WEIGHTS = "diffusion_pytorch_model.safetensors"
SOUND_PREFIXES = ("audio_",)


class LazyTensors(Mapping):
    """Read-only mapping key -> tensor over safetensors files, each tensor read when asked (CPU)."""

    def __init__(self, folder: Path):
        from safetensors import SafetensorError, safe_open
        single, index = folder / WEIGHTS, folder / (WEIGHTS + ".index.json")
        if single.is_file():
            files = [single]
        elif index.is_file():
            weight_map = read_json(index).get("weight_map")
            if not isinstance(weight_map, dict):
                raise CheckpointError(f"{index}: 'weight_map' must map keys to shard file names in {folder}")
            files = sorted({inside(folder, f, f"weight_map[{k!r}] (one of the shard file names)", index)
                            for k, f in weight_map.items()})
        else:
            raise FileNotFoundError(f"file not found: {single} (nor {index.name})")
        self._where: Dict[str, object] = {}
        self._handles = []
        for f in files:
            if not f.is_file():
                raise FileNotFoundError(f"file not found: {f}")
            try:
                h = safe_open(str(f), framework="pt")
            except (SafetensorError, OSError) as exc:
                raise CheckpointError(f"{f}: unreadable safetensors file, truncated or corrupt ({exc})") from None
            self._handles.append(h)
            for k in h.keys():
                if k in self._where:
                    raise CheckpointError(f"{f}: key {k} also in another shard")
                self._where[k] = (h, f)

    def shape(self, key: str) -> tuple:
        return tuple(self._where[key][0].get_slice(key).get_shape())

    def __getitem__(self, key: str) -> torch.Tensor:
        h, f = self._where[key]
        try:
            return h.get_tensor(key)
        except Exception as exc:   # safetensors raises its own types for a truncated payload
            raise CheckpointError(f"{f}: tensor {key} unreadable ({exc})") from None

    def __iter__(self):
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)


class _Shapes(Mapping):
    """Key -> an object with .shape, for validate_keys without reading the tensors."""

    def __init__(self, lazy: LazyTensors):
        self.lazy = lazy

    def __getitem__(self, key):
        return _Shape(self.lazy.shape(key))

    def __iter__(self):
        return iter(self.lazy)

    def __len__(self):
        return len(self.lazy)


@dataclass(frozen=True)
class _Shape:
    shape: tuple


def _check(lazy: LazyTensors, expected: Dict[str, tuple], ignored: Iterable[str], folder: Path) -> None:
    try:
        validate_keys(_Shapes(lazy), expected, ignored)
    except CheckpointError as exc:
        raise CheckpointError(f"{folder}: {exc}") from None


@dataclass
class Cosmos3Checkpoint:
    """What the policy reads from a pipeline folder."""

    folder: Path
    transformer: TransformerConfig
    vae: VaeConfig
    scheduler: UniPCConfig
    tokenizer_dir: Path
    use_system_prompt: bool
    transformer_weights: Mapping[str, torch.Tensor]     # LazyTensors from disk, or a dict in memory
    vae_weights: Mapping[str, torch.Tensor]


def _component(index: dict, name: str, folder: Path) -> Path:
    entry = index.get(name)
    if not (isinstance(entry, list) and len(entry) == 2 and entry[0] is not None):
        raise CheckpointError(f"{folder / 'model_index.json'}: no {name!r} component")
    sub = inside(folder, name, "component folder", folder / "model_index.json")
    if sub == folder.resolve() or not sub.is_dir():
        raise CheckpointError(f"{folder}: component folder {name}/ missing")
    return sub


def load_cosmos3_checkpoint(folder) -> Cosmos3Checkpoint:
    """Read and check a Cosmos3OmniPipeline folder (weights stay on disk until asked for)."""
    folder = Path(folder)
    index = read_json(fixed_file(folder, "model_index.json"))
    if index.get("_class_name") != PIPELINE_CLASS:
        raise CheckpointError(f"{folder / 'model_index.json'}: pipeline {index.get('_class_name')!r}, "
                              f"{PIPELINE_CLASS} expected")
    tdir, vdir = _component(index, "transformer", folder), _component(index, "vae", folder)
    sdir, kdir = _component(index, "scheduler", folder), _component(index, "text_tokenizer", folder)
    tcfg = TransformerConfig.from_json(read_json(fixed_file(tdir, "config.json")), tdir / "config.json")
    vcfg = VaeConfig.from_json(read_json(fixed_file(vdir, "config.json")), vdir / "config.json")
    native = index.get("use_native_flow_schedule", False)
    system = index.get("default_use_system_prompt", True)
    if not isinstance(native, bool) or not isinstance(system, bool):
        raise CheckpointError(f"{folder / 'model_index.json'}: use_native_flow_schedule / default_use_system_prompt "
                              "must be booleans")
    scfg = UniPCConfig.from_json(read_json(fixed_file(sdir, "scheduler_config.json")), sdir / "scheduler_config.json",
                                 native)
    if tcfg.latent_channel != vcfg.z_dim:
        raise CheckpointError(f"{folder}: transformer latent_channel {tcfg.latent_channel} != VAE z_dim {vcfg.z_dim}")
    tw, vw = LazyTensors(tdir), LazyTensors(vdir)
    sound = [k for k in tw if k.startswith(SOUND_PREFIXES)]
    expected = {k: v for k, v in tfm.key_shapes(tcfg).items() if k not in tfm.UNUSED_KEYS}
    _check(tw, expected, list(tfm.UNUSED_KEYS) + sound, tdir)
    _check(vw, vae_mod.key_shapes(vcfg), [k for k in vw if k.startswith(("decoder.", "post_quant_conv."))], vdir)
    return Cosmos3Checkpoint(folder, tcfg, vcfg, scfg, kdir, system, tw, vw)


def load_transformer_weights(ckpt: Cosmos3Checkpoint, dtype: torch.dtype, device, tp_rank: int = 0,
                             tp_size: int = 1) -> Dict[str, torch.Tensor]:
    """This rank's transformer weights (fused, sharded), checked finite."""
    w = tfm.shard_weights(ckpt.transformer_weights, ckpt.transformer, dtype, device, tp_rank, tp_size)
    require_finite(w, w.keys(), ckpt.folder / "transformer")
    return w


def load_vae_weights(ckpt: Cosmos3Checkpoint, dtype: torch.dtype, device) -> Dict[str, torch.Tensor]:
    w = {k: ckpt.vae_weights[k].to(device=device, dtype=dtype).contiguous() for k in vae_mod.key_shapes(ckpt.vae)}
    require_finite(w, w.keys(), ckpt.folder / "vae")
    return w


# ----------------------------------------------------------------------------- random weights at any size
def random_transformer_state(cfg: TransformerConfig, seed: int = 0, std: float = 0.02, device="cpu",
                             dtype: torch.dtype = torch.float32, lm_head: bool = True) -> Dict[str, torch.Tensor]:
    """A diffusers-keyed random state dict drawn on `device` (full size: draw on the GPU): norm gains 1 + 0.1 N,
    everything else (biases and embeddings too, so no term is silently zero) std * N. lm_head=False leaves out
    what the policy never reads (drawn all the same, so both give the same values for the other keys)."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for k, shape in sorted(tfm.key_shapes(cfg).items()):
        noise = torch.randn(shape, generator=gen, device=device)
        if not lm_head and k in tfm.UNUSED_KEYS:
            continue
        gain = len(shape) == 1 and k.endswith(".weight")
        out[k] = (1 + 0.1 * noise if gain else noise * std).to(dtype)
    return out


def random_vae_state(cfg: VaeConfig, seed: int = 0, device="cpu", dtype: torch.dtype = torch.float32
                     ) -> Dict[str, torch.Tensor]:
    """Random encoder weights (gammas 1, biases 0, convolutions scaled by 1 / sqrt(fan-in))."""
    gen = torch.Generator(device=device).manual_seed(seed)
    out = {}
    for k, shape in sorted(vae_mod.key_shapes(cfg).items()):
        if k.endswith("gamma"):
            out[k] = torch.ones(shape, device=device, dtype=dtype)
        elif k.endswith("bias"):
            out[k] = torch.zeros(shape, device=device, dtype=dtype)
        else:
            fan_in = math.prod(shape[1:])
            out[k] = (torch.randn(shape, generator=gen, device=device) / math.sqrt(fan_in)).to(dtype)
    return out


BYTE_SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|vision_start|>", "<|vision_end|>",
                 "<|vision_pad|>", "<|image_pad|>", "<|video_pad|>")
CHATML = ("{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + "
          "'<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def write_byte_tokenizer(folder) -> Path:
    """A byte-level BPE without merges (id == UTF-8 byte value, specials from 256) with a ChatML template: the
    shape of the parity fixtures' stand-in tokenizer, for random checkpoints that need no download."""
    from phyai_ros.models.bpe import byte_to_unicode
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = {ch: b for b, ch in byte_to_unicode().items()}
    added = [{"id": 256 + i, "content": t, "single_word": False, "lstrip": False, "rstrip": False,
              "normalized": False, "special": True} for i, t in enumerate(BYTE_SPECIALS)]
    spec = {"version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
            "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
            "post_processor": {"type": "TemplateProcessing", "single": [{"Sequence": {"id": "A", "type_id": 0}}],
                               "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                               "special_tokens": {}},
            "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
            "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                      "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                      "vocab": vocab, "merges": []}}
    (folder / "tokenizer.json").write_text(json.dumps(spec))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"backend": "tokenizers", "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>",
         "extra_special_tokens": list(BYTE_SPECIALS[1:]), "model_max_length": 32768,
         "tokenizer_class": "TokenizersBackend"}))
    (folder / "chat_template.jinja").write_text(CHATML)
    return folder


def _write_configs(folder: Path, transformer: TransformerConfig, vae: VaeConfig, scheduler: UniPCConfig,
                   tokenizer_from: Optional[Path]) -> None:
    for sub in ("transformer", "vae", "scheduler"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    (folder / "transformer" / "config.json").write_text(json.dumps(transformer.to_json(), indent=1))
    (folder / "vae" / "config.json").write_text(json.dumps(vae.to_json(), indent=1))
    (folder / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler.to_json(), indent=1))
    if tokenizer_from is not None:
        shutil.copytree(tokenizer_from, folder / "text_tokenizer", dirs_exist_ok=True)
    else:
        write_byte_tokenizer(folder / "text_tokenizer")
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": PIPELINE_CLASS, "_diffusers_version": "0.42.1", "default_use_system_prompt": True,
        "enable_safety_checker": False, "safety_checker": [None, None],
        "scheduler": ["diffusers", "UniPCMultistepScheduler"], "sound_tokenizer": [None, None],
        "text_tokenizer": ["transformers", "TokenizersBackend"], "transformer": ["diffusers", "Cosmos3OmniTransformer"],
        "use_native_flow_schedule": scheduler.native_flow_schedule, "vae": ["diffusers", "AutoencoderKLWan"]},
        indent=1))


def write_random_checkpoint(folder, transformer: TransformerConfig, vae: VaeConfig,
                            scheduler: Optional[UniPCConfig] = None, seed: int = 0, device="cpu",
                            dtype: torch.dtype = torch.float32, tokenizer_from: Optional[Path] = None,
                            std: float = 0.02) -> Path:
    """A Cosmos3OmniPipeline folder with random weights (drawn on `device`, saved as `dtype`); the tokenizer
    copied from `tokenizer_from` (a text_tokenizer folder) or the byte-level stand-in. Returns the folder."""
    from safetensors.torch import save_file
    folder = Path(folder)
    _write_configs(folder, transformer, vae, scheduler or UniPCConfig(flow_shift=5.0), tokenizer_from)
    save_file({k: v.cpu().contiguous() for k, v in
               random_transformer_state(transformer, seed, std, device, dtype, lm_head=False).items()},
              str(folder / "transformer" / WEIGHTS))
    save_file({k: v.cpu().contiguous() for k, v in random_vae_state(vae, seed + 1, device, dtype).items()},
              str(folder / "vae" / WEIGHTS))
    return folder


def random_checkpoint(folder, transformer: TransformerConfig, vae: VaeConfig,
                      scheduler: Optional[UniPCConfig] = None, seed: int = 0, device="cpu",
                      dtype: torch.dtype = torch.float32, std: float = 0.02) -> Cosmos3Checkpoint:
    """The same as write_random_checkpoint + load_cosmos3_checkpoint with the weights kept in memory on `device`
    (only the configs and tokenizer are written): full size without writing and reading ~30 GB."""
    folder = Path(folder)
    scheduler = scheduler or UniPCConfig(flow_shift=5.0)
    _write_configs(folder, transformer, vae, scheduler, None)
    return Cosmos3Checkpoint(folder, transformer, vae, scheduler, folder / "text_tokenizer", True,
                             random_transformer_state(transformer, seed, std, device, dtype, lm_head=False),
                             random_vae_state(vae, seed + 1, device, dtype))


__all__ = ["Cosmos3Checkpoint", "LazyTensors", "load_cosmos3_checkpoint", "load_transformer_weights",
           "load_vae_weights", "random_transformer_state", "random_vae_state", "write_random_checkpoint",
           "random_checkpoint",
           "write_byte_tokenizer", "CheckpointError", "require_finite"]
