"""The model contract: everything a policy family provides, in one base class (design.md §1).

A family is one folder under ``phyai_ros/models/`` and one registry entry (``phyai_ros/models/__init__.py``): its
adapter class subclasses ``PolicyAdapter``. The shared tools reach a family only through that class, so a new
family changes no shared file:

- the policy bridge (``phyai_ros.policies``) loads it (``load``) and drives it at batch 1 in robot units;
- ``python -m phyai_ros.predict`` runs a case of the parity-fixture format through it (``case_runner``);
- ``python -m phyai_ros.quant`` quantizes its checkpoints (``quantize``);
- the serve engine batches its requests (``serving == "batched"``: ``serve_prepare`` / ``serve_group`` /
  ``serve_sample``) or runs them one by one through ``predict``;
- tests and demos make small random checkpoints of it (``make_small_checkpoint``).

What differs by family is stated here as class facts (``family``, ``checkpoint_types``, ``rtc_modes``,
``needs_files``, ``masks_cameras``, ``serving``, ``embodiments``, ``expected_keys``), never found out with
``hasattr`` or a switch on the model type. A test checks every registered family (a fourth one from test/ too) against
this class.

Noise: the shared tools never build a family's noise (its shape may depend on the observation: Cosmos3's video
latents follow the camera image). They pass ``noise`` as a tensor the family made, a ``torch.Generator`` the
family draws it from (reproducible: the node's ``model.noise_seed``, a served request's seed), or None (fresh).
"""
from __future__ import annotations

import abc
from dataclasses import dataclass, field
from types import MappingProxyType
from pathlib import Path
from typing import TYPE_CHECKING, Callable, ClassVar, Dict, Hashable, List, Mapping, Optional, Sequence, Tuple, Union

import numpy as np
import torch

from phyai_ros.control.rtc import RTC_MODES, check_action_magnitudes
from phyai_ros.runtime.runner import Runner

from .files import fixed_file, read_json

if TYPE_CHECKING:
    from phyai_ros.control.rtc import RtcRequest
    from phyai_ros.layers.quantized import QuantScheme

Tensor = torch.Tensor
Noise = Union[Tensor, torch.Generator, None]
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
SERVING = ("batched", "single")
FILE_KINDS = ("tokenizer", "norm_stats")


@dataclass(frozen=True)
class ModelFiles:
    """The files a deployment names besides the checkpoint folder (node parameters ``model.tokenizer`` /
    ``model.norm_stats``, predict's ``--tokenizer`` / ``--norm-stats``); None where not given."""
    tokenizer: Optional[Path] = None
    norm_stats: Optional[Path] = None

    @classmethod
    def of(cls, tokenizer=None, norm_stats=None) -> "ModelFiles":
        return cls(Path(tokenizer) if tokenizer else None, Path(norm_stats) if norm_stats else None)


NO_FILES = ModelFiles()
NO_OPTIONS: Mapping[str, str] = MappingProxyType({})


def parse_options(text: str) -> Dict[str, str]:
    """``"key=value;key=value"`` (node parameter ``model.options``, predict's ``--options``) -> a dict: a family's
    run settings that are not in its checkpoint (e.g. Cosmos3's steps, guidance, chunk). Each family checks its
    own keys and values (``check_options``)."""
    out: Dict[str, str] = {}
    for item in filter(None, (s.strip() for s in str(text).split(";"))):
        key, sep, value = item.partition("=")
        if not sep or not key.strip() or not key.strip().isidentifier():
            raise ValueError(f"model option {item!r} is not key=value")
        if key.strip() in out:
            raise ValueError(f"model option {key.strip()!r} given twice")
        out[key.strip()] = value.strip()
    return out


@dataclass
class PredictCase:
    """One offline prediction in the parity-fixture format, as ``python -m phyai_ros.predict`` read it: the raw
    inputs (``inputs``: every tensor of the file; ``images``: camera -> uint8 [B, H, W, 3]; ``state`` [B, D]),
    the tasks, the fixture's metadata (``meta``: inputs.json) and case name, and the RTC flags. A family's
    ``case_runner`` reads the case facts its fixtures carry (each family writes them its own way)."""
    inputs: Dict[str, Tensor]
    images: Dict[str, Tensor]
    state: Tensor
    tasks: List[str]
    meta: Optional[dict] = None
    case: Optional[str] = None
    rtc: Optional[str] = None                   # a guided-RTC schedule (--rtc)
    inference_delay: Optional[int] = None
    execution_horizon: Optional[int] = None
    max_guidance: Optional[float] = None
    rtc_jacobian: str = "identity"
    prev_left_over: str = "rtc.prev_chunk_left_over"   # key in inputs
    prev_left_over_space: str = "normalized"           # or "robot"
    source: str = ""                                   # the inputs file it was read from

    @property
    def batch(self) -> int:
        return self.state.shape[0] if self.state.dim() == 2 else 1


# What a case runner returns: a callable timed by predict (from the raw inputs on), giving the outputs
# {"actions": [B, H, D] robot units, "actions.model": the model's own action tensor} and metadata to save.
CaseInfer = Callable[[], Tuple[Dict[str, Tensor], dict]]


@dataclass
class QuantizeRequest:
    """``python -m phyai_ros.quant``'s request to a family: quantize ``checkpoint`` into ``output``."""
    checkpoint: Path
    output: Path
    scheme: "QuantScheme"
    parts: Tuple[str, ...]
    dtype: torch.dtype
    device: str = "cpu"
    files: ModelFiles = field(default_factory=ModelFiles)
    calibration: Optional[PredictCase] = None   # static activation scales: observations to calibrate on


@dataclass
class QuantizeResult:
    output: Path
    layers: List[str]            # quantized weights
    skipped: List[str]           # left in float (the scheme cannot store their K)
    calibrated: bool = False


class ContractError(TypeError):
    """A registered family that does not keep the contract (a fact missing or of the wrong kind)."""


class PolicyAdapter(abc.ABC):
    """A policy family's adapter and registry entry: class facts, loading, the bridge's batch-1 API, serving
    and the tools' hooks. Images are camera -> uint8 HxWx3 RGB (None / missing: no frame); state and actions are
    float32 in robot units; ``rtc`` is the control loop's ``RtcRequest`` (robot units) or None."""

    # ------------------------------------------------------------ facts of the family
    family: ClassVar[str] = ""                         # the registry key: model.type
    checkpoint_types: ClassVar[Tuple[str, ...]] = ()   # config.json "type" values it loads ("" = no type)
    rtc_modes: Tuple[str, ...] = ("off",)              # of control.rtc.RTC_MODES; an instance may narrow them
    needs_files: ClassVar[Tuple[str, ...]] = ()        # of FILE_KINDS: files it reads besides the checkpoint
    masks_cameras: ClassVar[bool] = True               # a camera without a frame is a masked slot (else: required)
    serving: ClassVar[str] = "single"                  # "batched": the serve_* methods; "single": predict
    embodiments: ClassVar[bool] = False                # model.embodiment means something (select_embodiment)
    token_budget: Optional[int] = None                 # prompt tokens, where a prompt can be cut (fit_task)
    # predict's outputs -> the keys of a fixture's expected file they are compared with ("<case>." prefixed)
    expected_keys: ClassVar[Dict[str, str]] = {"actions": "actions.unnormalized", "actions.model": "actions.model"}
    # predict writes its outputs under "<case>." too (a set whose expected file keys every tensor by case), and
    # compares only the expected keys a case produced
    prefixed_outputs: ClassVar[bool] = False

    @classmethod
    def matches(cls, checkpoint: Path) -> bool:
        """Whether this family loads the folder: by default its config.json names one of ``checkpoint_types``
        (a missing "type" counts as ""). A family whose folders carry no config.json says how it knows its own."""
        config = fixed_file(checkpoint, "config.json")
        return config.is_file() and read_json(config).get("type", "") in cls.checkpoint_types

    # ------------------------------------------------------------ loading
    @classmethod
    @abc.abstractmethod
    def load(cls, checkpoint, files: ModelFiles = NO_FILES, camera_names: Optional[Sequence[str]] = None,
             device="cpu", dtype: torch.dtype = torch.float32,
             options: Mapping[str, str] = NO_OPTIONS) -> "PolicyAdapter":
        """Load a checkpoint folder (and the files it reads: ``needs_files``) for the robot's ``camera_names``
        (None: all of the checkpoint's), run with ``options`` (``parse_options``; ``check_options`` first).
        FileNotFoundError / ValueError (CheckpointError) name what is wrong. (Each family's ``from_files`` keeps
        its own convenient signature; this is the one the tools call.)"""

    @classmethod
    def check_options(cls, options: Mapping[str, str]) -> None:
        """Refuse options this family does not take (by default: all of them), naming them."""
        if options:
            raise ValueError(f"model type {cls.family} takes no model options, got {', '.join(options)}")

    @classmethod
    def check_files(cls, files: ModelFiles) -> None:
        """Naming a file this family does not read is an error (it would be silently ignored otherwise)."""
        for kind in FILE_KINDS:
            given = getattr(files, kind)
            if given is not None and kind not in cls.needs_files:
                raise ValueError(f"{cls.family} reads its {kind.replace('_', ' ')} from its checkpoint folders; "
                                 f"got a separate file '{given}' (leave it empty)")

    def configure_rtc(self, max_guidance: float, jacobian: str) -> None:
        """Guided RTC's settings (node parameters rtc.max_guidance / rtc.jacobian); families without guided
        RTC ignore them."""
        return None

    def select_embodiment(self, value: str) -> None:
        """Act as the embodiment ``value`` names (``embodiments`` families); others have none."""
        raise ValueError(f"{value!r}: model type {self.family} has no embodiments (leave model.embodiment empty)")

    # ------------------------------------------------------------ interface facts of a loaded checkpoint
    camera_names: List[str]

    @property
    @abc.abstractmethod
    def state_dim(self) -> int: ...

    @property
    @abc.abstractmethod
    def action_dim(self) -> int: ...

    @property
    @abc.abstractmethod
    def chunk_size(self) -> int:
        """Actions per chunk (H)."""

    @property
    def image_size(self) -> Optional[int]:
        """The square image input the model takes (frames resized with pad to it); None: any aspect ratio."""
        return None

    def quantization(self) -> str:
        """One log line: the scheme this checkpoint runs ('quantization none' for float weights)."""
        return "quantization none"

    def quantized_weights(self) -> list:
        """The distinct ``QuantizedWeight`` the model runs (none for float weights): the measured plan gives them
        dense copies where the device's profile runs bf16 (runtime.autotune.apply_quant_plan)."""
        return []

    # ------------------------------------------------------------ the bridge's API (batch 1)
    @abc.abstractmethod
    def predict(self, images: Mapping[str, Optional[np.ndarray]], state: np.ndarray, task: str, noise: Noise = None,
                rtc: Optional["RtcRequest"] = None) -> np.ndarray:
        """One observation -> float32 [chunk_size, action_dim] in robot units (``noise``: see the module
        docstring)."""

    def checked_rtc_prefix(self, rtc: "RtcRequest") -> np.ndarray:
        """The loop's RTC request held to this adapter (a mode of its ``rtc_modes`` other than "off", a finite
        prefix Y of [n, action_dim]): Y as a writable float32 copy in robot units (the request's is read-only),
        for the family to turn into its own RTC form."""
        if rtc.mode not in self.rtc_modes or rtc.mode == "off":
            supported = ", ".join(m for m in self.rtc_modes if m != "off") or "none (RTC off only)"
            raise ValueError(f"RTC mode {rtc.mode!r} is not supported by {type(self).__name__} "
                             f"(it supports {supported})")
        prev = np.array(rtc.prefix, dtype=np.float32)
        if prev.ndim != 2 or prev.shape[1] != self.action_dim:
            raise ValueError(f"RTC prefix must be [n, {self.action_dim}], got {list(prev.shape)}")
        check_action_magnitudes(prev, "RTC prefix")
        return prev

    @abc.abstractmethod
    def fit_task(self, task: str, state=None) -> Tuple[str, bool]:
        """(the text the model reads for ``task``, whether the task had to be cut to fit the prompt)."""

    runner: Optional[Runner] = None   # what use_runner made: every sample goes through it

    @abc.abstractmethod
    def use_runner(self, use_graphs: bool = False, token_bucket: int = 0) -> Runner:
        """The runner every sample goes through (a ``runtime.runner.Runner``; graphs only take effect on CUDA),
        kept as ``self.runner``."""

    def release(self) -> None:
        """The runner's graphs and buffers dropped (the node's cleanup): the adapter stays usable, and its next
        call makes and captures them again."""
        if self.runner is not None:
            self.runner.release()

    @abc.abstractmethod
    def capture_buckets(self, images, state, eager: bool = False, min_cameras: Optional[int] = None) -> list:
        """Capture the graphs a deployment can need at start-up (eager: the same shapes without graphs, for the
        operator autotune's recording; min_cameras: every count of cameras present from it up)."""

    # ------------------------------------------------------------ serving (serving == "batched")
    def serve_prepare(self, images, state, task: str, seed: int, rtc: Optional["RtcRequest"]):
        """One request alone -> a row, its noise drawn from ``seed`` (ValueError: the request's own fault)."""
        raise NotImplementedError(f"{self.family} serves requests one by one")

    def serve_group(self, row) -> Hashable:
        """Rows with the same key can share one runner call."""
        raise NotImplementedError(f"{self.family} serves requests one by one")

    def serve_sample(self, rows: list) -> np.ndarray:
        """One runner call for a group of rows -> float32 [len(rows), H, D] robot units, each row what it
        computes alone."""
        raise NotImplementedError(f"{self.family} serves requests one by one")

    # ------------------------------------------------------------ tools
    def case_runner(self, case: PredictCase, noise: Noise) -> CaseInfer:
        """predict: the callable computing ``case`` from its raw inputs with ``noise`` (the inputs' or --noise's
        tensor, else a generator seeded with --seed; a family whose fixtures record their noise per case may
        take it from the case). InputError (phyai_ros.models.cases) for a case it cannot run."""
        raise NotImplementedError(f"{self.family} has no offline prediction")

    @classmethod
    def quantize(cls, request: QuantizeRequest) -> QuantizeResult:
        """The quantizer's hook: quantize ``request.checkpoint`` (a float folder: the quantizer refuses a quantized
        one for every family) into a folder ``load`` loads."""
        raise ValueError(f"quantization is not available for {cls.family} checkpoints")

    @classmethod
    @abc.abstractmethod
    def make_small_checkpoint(cls, directory, *, fixtures: Optional[Path] = None, **sizes) -> Path:
        """Write a small random-weight checkpoint (tests, demos); returns the folder ``load`` takes. ``fixtures``:
        the shared parity-fixture folder, for families that copy files from it (processor configs, ...)."""


def check_family(cls: type) -> None:
    """ContractError unless ``cls`` is a complete PolicyAdapter with well-formed facts."""
    if not (isinstance(cls, type) and issubclass(cls, PolicyAdapter)):
        raise ContractError(f"{cls!r} is not a PolicyAdapter subclass")
    if getattr(cls, "__abstractmethods__", None):
        raise ContractError(f"{cls.__name__} leaves abstract: {', '.join(sorted(cls.__abstractmethods__))}")
    problems = []
    if not cls.family or not cls.family.isidentifier():
        problems.append(f"family {cls.family!r} is not an identifier")
    if not cls.checkpoint_types or not all(isinstance(t, str) for t in cls.checkpoint_types):
        problems.append("checkpoint_types must name the config.json types it loads")
    if not set(cls.rtc_modes) <= set(RTC_MODES) or "off" not in cls.rtc_modes:
        problems.append(f"rtc_modes {cls.rtc_modes} must be of {RTC_MODES} and include 'off'")
    if not set(cls.needs_files) <= set(FILE_KINDS):
        problems.append(f"needs_files {cls.needs_files} must be of {FILE_KINDS}")
    if cls.serving not in SERVING:
        problems.append(f"serving {cls.serving!r} must be one of {SERVING}")
    if problems:
        raise ContractError(f"{cls.__name__}: " + "; ".join(problems))


__all__ = ["PolicyAdapter", "ModelFiles", "PredictCase", "CaseInfer", "Noise", "QuantizeRequest", "QuantizeResult",
           "ContractError", "check_family", "DTYPES", "SERVING", "FILE_KINDS", "NO_FILES", "NO_OPTIONS", "parse_options"]
