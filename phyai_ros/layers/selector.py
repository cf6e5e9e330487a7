"""Operator selection: per op, candidates chosen by (shape, dtype, device capability).

Each op the layers use has an ordered list of candidates (fused Triton kernels,
plain torch). A candidate is *usable* where its backend imports and runs on the
tensor's device, and, while a CUDA graph is being captured, only if it is
capture-safe. Which usable candidate runs comes from a per-device profile
(written by ``scripts/profile_ops.py`` on the target, e.g. a Jetson Thor, or by the
node's ``model.op_autotune``; found per device by ``phyai_ros.layers.profiles``) keyed by
op and shape (a shape the profile lacks takes the entry of the nearest profiled one that differs in a single
length, ``nearest_key``); without an entry the first usable candidate in preference order runs. A candidate
that raises is disabled for that key and the call falls back to the next one, so a platform whose Triton
cannot build a kernel still runs (the warm-up before graph capture meets any such failure first). Each op's
last candidate is its reference and always usable: "torch", or, for a fused op, "unfused" (its sub-ops, each
selected on its own).

``PHYAI_OPS=torch`` forces the torch candidates everywhere (A/B measurements);
fused ops then run "unfused", i.e. their torch sub-ops. ``PHYAI_OP_PROFILE=FILE`` loads a profile into
``SELECTOR``; ``PHYAI_OP_PROFILE=none`` makes every selector run without one (no cached or shipped profile
either: the defaults, for A/B measurements).

``SELECTOR`` is the default (scripts, tests, anything outside a policy). A policy owns a selector of its
own (``SELECTOR.derive(profile)``: same candidates, its own profile and fallbacks) and makes it the active
one around its calls (``with selector.active():``); the ops ask ``active_selector()`` first.
"""
from __future__ import annotations

import json
import logging
import os
import threading
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Optional

import torch

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Candidate:
    name: str
    fn: Callable
    devices: tuple = ("cpu", "cuda")
    capture_safe: bool = True
    available: Callable[[], bool] = lambda: True
    supports: Optional[Callable[..., bool]] = None   # (args of the call) -> can this candidate take them?
    profiled_only: bool = False   # chosen only where a device profile names it (slower on some devices)
    # checked, when profiled, against its own function on torch sub-ops instead of the op's reference: it computes
    # something more exact than that reference (a quantized linear's "dense": no activation quantization)
    own_reference: bool = False


def device_signature(device: torch.device) -> str:
    """'cuda:sm90:NVIDIA H200' style key of a profile; 'cpu' on the CPU."""
    if device.type != "cuda":
        return "cpu"
    major, minor = torch.cuda.get_device_capability(device)
    return f"cuda:sm{major}{minor}:{torch.cuda.get_device_name(device)}"


def shape_key(*tensors: torch.Tensor) -> str:
    """Shapes and dtype of the op's main operands, e.g. '1x50x1024|bfloat16'."""
    dims = ",".join("x".join(str(d) for d in t.shape) for t in tensors)
    return f"{dims}|{str(tensors[0].dtype).replace('torch.', '')}"


NEAREST_RATIO = 2.0   # how far one length may be from the profiled one for its choice to stand in


def _key_dims(key: str):
    """'1x103x2048,6144x2048|bfloat16' -> ((1, 103, 2048, 6144, 2048), which of those are lengths, (3, 2),
    '|bfloat16'), or None. A length is a dimension of an activation-like operand (rank >= 3) other than its last:
    the kernels are specialised by widths (last dimensions, weight shapes), not by lengths."""
    dims, bar, tail = key.partition("|")
    try:
        parts = [tuple(int(d) for d in t.split("x")) for t in dims.split(",")]
    except ValueError:
        return None
    lengths = tuple(len(p) >= 3 and i < len(p) - 1 for p in parts for i in range(len(p)))
    return tuple(d for p in parts for d in p), lengths, tuple(len(p) for p in parts), bar + tail


def nearest_key(table: dict, key: str) -> Optional[str]:
    """The profiled key that stands in for ``key`` when the profile has no entry of its own: the same operands,
    widths, ranks and dtype, differing only in one length (every differing dimension a length with the same pair
    of values, e.g. a prompt's token count in the rows and in the keys) by at most NEAREST_RATIO; the closest
    such, else None. A policy whose sequence length follows its instruction (GR00T's unpadded prompt) then runs
    with the choices profiled at a nearby length instead of the defaults (the candidates' ``supports`` still
    check the call)."""
    want = _key_dims(key)
    if want is None:
        return None
    best = None
    for other in table:
        have = _key_dims(other)
        if have is None or have[1:] != want[1:]:
            continue
        diff = [(a, b) for a, b, length in zip(want[0], have[0], want[1]) if a != b and length]
        if len(set(diff)) != 1 or sum(a != b for a, b in zip(want[0], have[0])) != len(diff):
            continue
        a, b = diff[0]
        ratio = max(a, b) / max(min(a, b), 1)
        if ratio <= NEAREST_RATIO and (best is None or (ratio, other) < best):
            best = (ratio, other)
    return best[1] if best else None


class ProfileError(ValueError):
    """A profile file that is not one (unreadable, not JSON, or of the wrong structure), named with what is wrong."""


def check_profile(data, source) -> dict:
    """A profile's data checked: ``{"devices": {signature: {op: {shape key: candidate name}}}, "timings":
    {signature: {op: {shape key: {candidate: result}}}}, "meta": {...}}`` (every section optional, other keys
    ignored; "meta": the stamp of what timed it, layers.profiles); returns it with both tables present. A file of
    another structure (a list, a NaN or a table where a name belongs) would otherwise fail deep inside a policy's
    start with no file named."""
    if not isinstance(data, dict):
        raise ProfileError(f"{source}: a profile is a JSON object, got {type(data).__name__}")
    out = dict(data)
    if not isinstance(out.get("meta", {}), dict):
        raise ProfileError(f"{source}: 'meta' must be an object, got {out['meta']!r}"[:300])
    for section, leaf in (("devices", str), ("timings", dict)):
        tables = out.setdefault(section, {})
        if not isinstance(tables, dict):
            raise ProfileError(f"{source}: '{section}' must map device signatures to tables, got "
                               f"{type(tables).__name__}")
        for signature, table in tables.items():
            if not isinstance(table, dict):
                raise ProfileError(f"{source}: {section}[{signature!r}] must map ops to tables, got {table!r}"[:300])
            for op, keys in table.items():
                if not isinstance(keys, dict):
                    raise ProfileError(f"{source}: {section}[{signature!r}][{op!r}] must map shape keys to "
                                       f"{'candidate names' if leaf is str else 'timings'}, got {keys!r}"[:300])
                for key, value in keys.items():
                    if not isinstance(value, leaf):
                        raise ProfileError(f"{source}: {section}[{signature!r}][{op!r}][{key!r}] must be "
                                           f"{'a candidate name' if leaf is str else 'an object'}, got {value!r}"[:300])
    return out


# A profile holds a few hundred (op, shape) entries per device (the shipped ones are ~0.1 MB): a file past this
# is not one, and is refused before it is read (an explicit model.op_profile is a path from outside).
MAX_PROFILE_BYTES = 16 << 20


def read_profile(path) -> dict:
    """A profile file, checked (``check_profile``); ProfileError naming the file otherwise (one over
    MAX_PROFILE_BYTES without reading it)."""
    try:
        size = Path(path).stat().st_size
        data = None if size > MAX_PROFILE_BYTES else json.loads(Path(path).read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ProfileError(f"{path}: unreadable ({type(exc).__name__}: {exc})") from None
    if data is None:
        raise ProfileError(f"{path}: {size} bytes, over the {MAX_PROFILE_BYTES} a profile may have: not read")
    return check_profile(data, path)


@dataclass
class OperatorSelector:
    candidates: dict = field(default_factory=dict)       # op -> [Candidate] in preference order
    profile: dict = field(default_factory=dict)          # device signature -> {op: {shape key: name}}
    disabled: set = field(default_factory=set)           # (op, key, name) that raised
    forced: Optional[str] = None                          # a candidate name to use everywhere, if usable
    recording: Optional[dict] = None                      # (op, key) -> (args, kwargs) seen, for profiling
    sources: list = field(default_factory=list)           # (path, device signatures) of each profile file loaded
    _lock: threading.Lock = field(default_factory=threading.Lock)
    # (signature, op, key, size of the op's table) -> the nearest profiled key, "" for none: an eager path
    # (Cosmos3's conditioning, warm-ups) would otherwise scan the op's table on every call the profile lacks
    _nearest: dict = field(default_factory=dict)

    def derive(self, profile_path=None) -> "OperatorSelector":
        """A selector for one policy: these candidates and this forcing, a copy of the profile plus the
        given profile file, and fallbacks of its own."""
        own = OperatorSelector(candidates=self.candidates, forced=self.forced,
                               profile={sig: {op: dict(t) for op, t in table.items()}
                                        for sig, table in self.profile.items()}, sources=list(self.sources))
        if profile_path:
            own.load_profile(profile_path)
        return own

    @contextmanager
    def active(self):
        """Make this the selector the ops use in the current thread / context."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def register(self, op: str, candidate: Candidate) -> None:
        self.candidates.setdefault(op, []).append(candidate)

    def load_profile(self, path) -> bool:
        """Add a profile file's tables; a file that is not a valid profile is skipped with a warning naming it (the
        defaults run instead), a missing one is FileNotFoundError. Returns whether it was loaded."""
        if not Path(path).is_file():
            raise FileNotFoundError(f"operator profile not found: {path}")
        try:
            data = read_profile(path)
        except ProfileError as exc:
            log.warning("operator profile %s skipped, the defaults run instead: %s", path, exc)
            return False
        for signature, table in data["devices"].items():
            own = self.profile.setdefault(signature, {})
            for op, keys in table.items():
                own.setdefault(op, {}).update(keys)
        self.sources.append((str(path), frozenset(data["devices"])))
        return True

    def usable(self, op: str, key: str, device: torch.device) -> list[Candidate]:
        capturing = device.type == "cuda" and torch.cuda.is_current_stream_capturing()
        return [c for c in self.candidates[op]
                if device.type in c.devices and (op, key, c.name) not in self.disabled
                and (c.capture_safe or not capturing) and c.available()]

    def choose(self, op: str, key: str, device: torch.device, args: tuple = ()) -> Candidate:
        usable = [c for c in self.usable(op, key, device) if c.supports is None or c.supports(*args)]
        if not usable:
            raise RuntimeError(f"no usable candidate for {op} on {device}")
        wanted = self.forced
        if not wanted:
            signature = device_signature(device)
            table = self.profile.get(signature, {}).get(op, {})
            wanted = table.get(key)
            if wanted is None and table:
                memo = (signature, op, key, len(table))
                near = self._nearest.get(memo)
                if near is None or (near and near not in table):
                    near = self._nearest[memo] = nearest_key(table, key) or ""
                wanted = table[near] if near else None
        for c in usable:
            if c.name == wanted:
                return c
        # Forcing a name the op lacks (a fused op has no "torch" candidate) means its reference: the last one.
        if self.forced:
            return usable[-1]
        return next((c for c in usable if not c.profiled_only), usable[-1])

    def call(self, op: str, key: str, device: torch.device, *args, **kwargs):
        if self.recording is not None and (op, key) not in self.recording:
            self.recording[(op, key)] = (args, kwargs)
        c = self.choose(op, key, device, args)
        try:
            return c.fn(*args, **kwargs)
        except Exception as exc:  # a backend that cannot run here: fall back, never fail the policy
            if c is self.candidates[op][-1]:  # the reference: nothing left to fall back to
                raise
            with self._lock:
                self.disabled.add((op, key, c.name))
            log.warning("operator %s candidate %s failed for %s (%s); falling back", op, c.name, key, exc)
            return self.call(op, key, device, *args, **kwargs)


_ACTIVE: ContextVar[Optional[OperatorSelector]] = ContextVar("phyai_ros_operator_selector", default=None)


def active_selector() -> Optional[OperatorSelector]:
    """The selector made active by the policy running in this context, if any."""
    return _ACTIVE.get()


SELECTOR = OperatorSelector(forced="torch" if os.environ.get("PHYAI_OPS") == "torch" else None)
if os.environ.get("PHYAI_OP_PROFILE", "none") != "none":   # "none": no profile at all (layers.profiles)
    SELECTOR.load_profile(os.environ["PHYAI_OP_PROFILE"])
