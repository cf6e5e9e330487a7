"""Where a device's operator profile comes from, so that a node performs without a hand-made one.

A profile file is ``{"devices": {signature: {op: {shape key: candidate}}}, "timings": {...}}`` (what
``scripts/profile_ops.py`` and the node's ``model.op_autotune`` write); its tables are keyed by device signature
(``selector.device_signature``, e.g. "cuda:sm90:NVIDIA H200"). For one device, the first of these that has a table
for its signature is used:

1. explicit: the file given by the node's ``model.op_profile`` (or ``PHYAI_OP_PROFILE``, which the module selector
   loads at import);
2. cache: the per-user file of this device, ``$PHYAI_PROFILE_CACHE/<signature>.json`` (default
   ``${XDG_CACHE_HOME:-~/.cache}/phyai_ros/profiles``), written by ``model.op_autotune`` on a device nothing
   matched;
3. shipped: ``profiles/*.json`` of the package (installed as ``phyai_ros/profiles``; in a checkout the top-level
   ``profiles/`` folder; ``$PHYAI_PROFILES_DIR`` instead where set), in name order.

``PHYAI_OP_PROFILE=none`` turns the search off (the selector's defaults: an A/B baseline); an explicit file given
to ``selector_for`` still counts.

Only the winner is loaded: precedence is per device, so an explicit file for the Thor leaves an H200 to its cached
or shipped profile (with a warning that the explicit one has no table for it).

Every file written here carries a ``meta`` stamp (``profile_stamp``): the file format, a fingerprint of the kernels
(their sources and the registered candidates with their launch shapes) and the Triton, torch and CUDA versions
that timed them. A cached file of another stamp is stale (an upgrade changed what was measured): it is ignored with
a warning naming what differs, and the next autotune replaces it. So is a cache file with no table for this device
(copied from another machine). An explicit or shipped file of another stamp is still used (an operator's choice,
the package's best knowledge), with a note: a kernel edit does not make a measured profile worthless, and a
shipped one cannot be re-measured on every machine.
"""
from __future__ import annotations

import fcntl
import functools
import hashlib
import importlib.metadata
import json
import logging
import os
import re
import tempfile
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

import torch

import phyai_ros.kernels as kernels_package

from phyai_ros.layers.selector import SELECTOR, OperatorSelector, ProfileError, device_signature, read_profile

log = logging.getLogger(__name__)

_PACKAGE = Path(__file__).resolve().parents[1]
FORMAT = 2   # 2: files carry the "meta" stamp


@functools.lru_cache(maxsize=1)
def _kernel_sources_digest() -> bytes:
    """The kernel sources' digest, read once per process (the files do not change under a running one)."""
    digest = hashlib.sha256()
    for root in map(Path, kernels_package.__path__):   # a namespace package: kernels/ mapped in
        for path in sorted(root.rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.digest()


def kernels_fingerprint(selector: Optional[OperatorSelector] = None) -> str:
    """12 hex digits that change when what a profile measured changes: every kernel source file (candidates/
    included) and every registered candidate with its launch-shape keywords (a tiling's blocks, warps, splits)."""
    digest = hashlib.sha256(_kernel_sources_digest())
    for op, cands in sorted((selector or SELECTOR).candidates.items()):
        for c in cands:
            digest.update(f"{op}:{c.name}:{sorted(getattr(c.fn, 'keywords', {}).items())}\n".encode())
    return digest.hexdigest()[:12]


def _version(dist: str) -> Optional[str]:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return None


def profile_stamp() -> dict:
    """The ``meta`` of a profile timed here and now: what a cached one must match to be used."""
    return {"format": FORMAT, "kernels": kernels_fingerprint(), "triton": _version("triton"),
            "torch": torch.__version__, "cuda": torch.version.cuda}


def stale_reason(data: dict, stamp: Optional[dict] = None) -> str:
    """Why a profile's data was timed under other kernels or versions than ``stamp`` (this process's by default),
    e.g. "kernels 1a2b3c4d5e6f != 0f9e8d7c6b5a"; "" for a file of the same stamp."""
    stamp = profile_stamp() if stamp is None else stamp
    meta = data.get("meta")
    if not isinstance(meta, dict):
        return "no stamp (written before profiles carried one)"
    return "; ".join(f"{k} {meta.get(k)} != {v}" for k, v in stamp.items() if meta.get(k) != v)


@dataclass(frozen=True)
class ProfileChoice:
    """Which profile file a selector uses for one device (path None: none matched; origin says why)."""

    signature: str
    path: Optional[Path]
    origin: str                 # "explicit", "cache", "shipped", "autotune", or "none"
    looked_in: tuple = ()       # the places searched, for the message when none matched
    detail: str = ""            # autotune: what was profiled, in how long

    def describe(self) -> str:
        how = f"{self.origin}: {self.detail}" if self.detail else self.origin
        if self.path is not None:
            return f"operator profile for {self.signature}: {self.path} ({how})"
        if self.origin == "autotune":
            return f"operator profile for {self.signature}: profiled at start-up ({self.detail})"
        where = "; ".join(str(p) for p in self.looked_in) or "nowhere"
        return (f"no operator profile for {self.signature} (looked in {where}): every fused kernel that builds "
                "here, torch otherwise")


def shipped_dir() -> Optional[Path]:
    """The package's profiles: ``phyai_ros/profiles`` when installed (wheel, colcon), else a checkout's
    top-level ``profiles/`` (next to ``kernels/``, as ``phyai_ros.kernels`` is mapped)."""
    if os.environ.get("PHYAI_PROFILES_DIR"):
        return Path(os.environ["PHYAI_PROFILES_DIR"])
    for d in (_PACKAGE / "profiles", _PACKAGE.parent / "profiles"):
        if d.is_dir() and (d.parent / "kernels").is_dir():
            return d
    return None


def cache_dir() -> Path:
    """``$PHYAI_PROFILE_CACHE``, else ``${XDG_CACHE_HOME:-~/.cache}/phyai_ros/profiles``."""
    if os.environ.get("PHYAI_PROFILE_CACHE"):
        return Path(os.environ["PHYAI_PROFILE_CACHE"])
    base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(base) / "phyai_ros" / "profiles"


def cache_file(signature: str, directory: Optional[Path] = None) -> Path:
    """The cache file of one device: its signature with every character outside [A-Za-z0-9._-] as '_'."""
    return Path(directory or cache_dir()) / (re.sub(r"[^A-Za-z0-9._-]+", "_", signature) + ".json")


def _valid_profile(path: Path) -> Optional[dict]:
    """A profile file's data, or None for a file that is not a valid profile (with a warning naming it)."""
    try:
        return read_profile(path)
    except ProfileError as exc:
        log.warning("operator profile %s skipped: %s", path, exc)
        return None


def signatures_in(path: Path) -> frozenset:
    """The device signatures a profile file has tables for (empty for a file that is not a valid profile, with a
    warning naming it)."""
    data = _valid_profile(path)
    return frozenset(data["devices"]) if data is not None else frozenset()


def usable_cache(path: Path, signature: str) -> bool:
    """Whether the cache file ``path`` is this device's profile for this install: a valid profile, with a table for
    ``signature``, stamped as this process would stamp it. Otherwise False with a warning saying which (the
    next autotune rewrites it)."""
    try:
        data = read_profile(path)
    except ProfileError as exc:
        log.warning("cached operator profile %s ignored: %s", path, exc)
        return False
    if signature not in data["devices"]:
        held = ", ".join(sorted(data["devices"])) or "none"
        log.warning("cached operator profile %s ignored: it has no table for %s (it holds: %s)", path, signature, held)
        return False
    why = stale_reason(data)
    if why:
        log.warning("cached operator profile %s ignored: timed under other kernels or versions (%s)", path, why)
        return False
    return True


def find_profile(signature: str, cache: Optional[Path] = None, shipped: Optional[Path] = None) -> ProfileChoice:
    """The cached profile of this device (``usable_cache``), else the first shipped one with a table for it (not
    the explicit file: ``selector_for`` handles that). cache / shipped: the folders (default ``cache_dir()`` /
    ``shipped_dir()``; shipped may be None for none)."""
    cached = cache_file(signature, cache)
    if cached.is_file() and usable_cache(cached, signature):
        return ProfileChoice(signature, cached, "cache")
    shipped = shipped_dir() if shipped is None else shipped
    looked = (cached,) + ((shipped,) if shipped is not None else ())
    if shipped is not None and shipped.is_dir():
        for path in sorted(shipped.glob("*.json")):
            data = _valid_profile(path)
            if data is not None and signature in data["devices"]:
                _note_stamp(path, "shipped", data)
                return ProfileChoice(signature, path, "shipped")
    return ProfileChoice(signature, None, "none", looked)


def _note_stamp(path: Path, origin: str, data: Optional[dict] = None) -> None:
    """An explicit or shipped file timed under other kernels is used, and the log says so (``data``: the file's,
    where already read)."""
    if data is None:
        try:
            data = read_profile(path)
        except ProfileError:
            return
    why = stale_reason(data)
    if why:
        log.info("%s operator profile %s was timed under other kernels or versions (%s); used as given", origin,
                 path, why)


def selector_for(device, explicit=None, base: Optional[OperatorSelector] = None, cache: Optional[Path] = None,
                 shipped: Optional[Path] = None) -> tuple[OperatorSelector, ProfileChoice]:
    """A policy's selector for ``device`` (derived from ``base``, the module's SELECTOR by default) with the
    device's profile by the precedence above. ``explicit``: a profile file (the node's ``model.op_profile``;
    missing: FileNotFoundError); the base's own files (``PHYAI_OP_PROFILE``) count as explicit too."""
    base = SELECTOR if base is None else base
    device = torch.device(device)
    sel = base.derive(explicit)
    if device.type == "cuda" and not torch.cuda.is_available():
        return sel, ProfileChoice("cuda (not available)", None, "none")
    signature = device_signature(device)
    given = [path for path, sigs in sel.sources if signature in sigs]
    if given:
        choice = ProfileChoice(signature, Path(given[-1]), "explicit")
        _note_stamp(choice.path, "explicit")
    elif os.environ.get("PHYAI_OP_PROFILE") == "none":
        choice = ProfileChoice(signature, None, "none", ("nowhere: PHYAI_OP_PROFILE=none",))
    else:
        if sel.sources:
            log.warning("operator profile %s has no table for %s; looking for a cached or shipped one",
                        ", ".join(p for p, _ in sel.sources), signature)
        choice = find_profile(signature, cache, shipped)
        if choice.path is not None:
            sel.load_profile(choice.path)
    log.info(choice.describe())
    return sel, choice


def load_device_profile(device, selector: Optional[OperatorSelector] = None, **where) -> ProfileChoice:
    """For a process that runs one model (benchmarks, scripts): load the device's profile into ``selector``
    (the module SELECTOR by default) by the same precedence, and say which."""
    selector = SELECTOR if selector is None else selector
    own, choice = selector_for(device, base=selector, **where)
    selector.profile, selector.sources = own.profile, own.sources
    return choice


@contextmanager
def _locked(path: Path):
    """An exclusive lock for a read-merge-write of ``path``, taken on its folder (no lock file to leave behind or
    to race on): two processes autotuning on one device at once each add their entries to the other's."""
    fd = os.open(path.parent, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)   # releases the lock


def write_profile(path: Path, signature: str, table: dict, timings: dict, merge: bool = True,
                  stamp: Optional[dict] = None) -> Path:
    """Write a profile file atomically: into a temporary file in the same folder, flushed, then renamed over
    ``path``, so a reader (another node starting) sees the old file or the new one, never a part, and a failure
    leaves the old one. merge: the device's table and timings go over what the file already holds (other
    devices, other shapes), read and written under a lock so that concurrent writers lose nothing; a file that is
    not a valid profile, or that was timed under another stamp (stale: its entries would mix two kernel
    versions), is replaced, with a warning. Otherwise the file holds this device's alone. The file is stamped with
    ``stamp`` (``profile_stamp()`` by default)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    stamp = profile_stamp() if stamp is None else stamp
    with _locked(path):
        data = {"devices": {}, "timings": {}}
        if merge and path.is_file():
            try:
                old = read_profile(path)
                why = stale_reason(old, stamp)
                if why:
                    log.warning("operator profile %s was timed under other kernels or versions (%s): replaced",
                                path, why)
                else:
                    data = old
            except ProfileError as exc:
                log.warning("operator profile %s is not a valid profile, rewritten: %s", path, exc)
        data["meta"] = stamp
        for section, new in (("devices", table), ("timings", timings)):
            device = data.setdefault(section, {}).setdefault(signature, {})
            for op, keys in new.items():
                device.setdefault(op, {}).update(keys)
        text = json.dumps(data, indent=1)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(text)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
    return path
