"""Which candidates a bounded autotune times: per (op, shape), the ones the nearest measured device found fastest.

A full profile (``scripts/profile_ops.py``) times every usable candidate of every call: minutes on a GPU, most of
them spent compiling Triton variants that lose. A device that no profile matches (a new GPU, the robot's Thor)
needs nearly the same choices in seconds, and the shipped profiles already say which variants win where: their
timings sections rank every candidate per shape. So the start-up autotune times, per call:

* the ``size`` best of the nearest measured device's ranking for this shape (or the nearest shape that differs
  in one length, ``selector.nearest_key``), as far as they can take this call here;
* the default (what runs without a profile), so a tuned choice is never worse than none;
* any candidate that no measured device ever timed for this op (newer than every shipped profile);
* every candidate, where no measured device has timings of this op at all (nothing to rank by).

Where the shape has no ranking of its own, the op's candidates are ranked by how often each won over all the
shapes measured. Under a budget, the calls are tuned in order of what the nearest device gained at them over the
default (``Priors.gain``; unmeasured ones after those that gained, before those that did not). "Nearest
device": the same compute capability first, then the closest one (sm89 is nearer sm90 than sm110 is); devices
at the same distance are interleaved rank by rank (in signature order).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Optional, Sequence

from phyai_ros.layers.selector import Candidate, ProfileError, nearest_key, read_profile

SHORTLIST = 3   # ranked candidates timed per call, besides the default and never-measured ones


def compute_capability(signature: str) -> Optional[int]:
    """'cuda:sm90:NVIDIA H200' -> 90; None for the CPU or an unknown form."""
    m = re.match(r"cuda:sm(\d+):", signature)
    return int(m.group(1)) if m else None


def _timed(entry: dict) -> dict:
    """name -> microseconds of a call's timings, the correct results only ("failed: ...", wrong outputs and
    untimed ones left out)."""
    return {name: float(r["us"]) for name, r in entry.items()
            if isinstance(r, dict) and r.get("ok") and isinstance(r.get("us"), (int, float))}


def _stand_in(entries: dict, key: str) -> Optional[str]:
    """The key whose timings stand for ``key`` in one device's timings of an op: its own, else the nearest."""
    return key if key in entries else nearest_key(entries, key) if entries else None


@dataclass(frozen=True)
class Priors:
    """Timings other devices measured, nearest first: ((signature, distance, {op: {key: {name: result}}}), ...)."""

    tables: tuple = ()

    @classmethod
    def load(cls, signature: str, files: Iterable[Path]) -> "Priors":
        """The timings of every device in ``files`` (profile files; a bad one is skipped) except ``signature``'s
        own, ordered by distance of compute capability (unknown: last)."""
        own = compute_capability(signature)
        found = {}
        for path in files:
            try:
                data = read_profile(path)
            except ProfileError:
                continue
            for sig, timings in data["timings"].items():
                if sig != signature and timings and sig not in found:
                    cc = compute_capability(sig)
                    distance = abs(cc - own) if cc is not None and own is not None else 10 ** 6
                    found[sig] = (sig, distance, timings)
        return cls(tuple(sorted(found.values(), key=lambda t: (t[1], t[0]))))

    def ranking(self, op: str, key: str) -> list:
        """Candidate names best first for this call: from the nearest devices that measured this shape or a
        nearest one (interleaved where equally near), else by wins over the op's measured shapes."""
        for distance in sorted({d for _, d, _ in self.tables}):
            lists = []
            for _, d, timings in self.tables:
                entries = timings.get(op, {}) if d == distance else {}
                near = _stand_in(entries, key)
                if near:
                    timed = _timed(entries[near])
                    lists.append(sorted(timed, key=lambda name: (timed[name], name)))
            if any(lists):
                merged = []
                for rank in range(max(map(len, lists))):
                    for ls in lists:
                        if rank < len(ls) and ls[rank] not in merged:
                            merged.append(ls[rank])
                return merged
        wins = Counter()
        for _, _, timings in self.tables:
            for entry in timings.get(op, {}).values():
                timed = _timed(entry)
                if timed:
                    wins[min(timed, key=lambda name: (timed[name], name))] += 1
        return [name for name, _ in wins.most_common()]

    def gain(self, op: str, key: str, default: str) -> Optional[float]:
        """Microseconds the nearest measured device saved at this call (or its nearest shape) by its fastest
        candidate over ``default``: how much tuning the call is worth (None: no device measured it)."""
        for _, _, timings in self.tables:
            entries = timings.get(op, {})
            near = _stand_in(entries, key)
            if near:
                timed = _timed(entries[near])
                if default in timed:
                    return timed[default] - min(timed.values())
        return None

    def measured(self, op: str) -> set:
        """Every candidate name some device timed (or tried) for this op."""
        return {name for _, _, timings in self.tables for entry in timings.get(op, {}).values() for name in entry}


def shortlist(priors: Priors, op: str, key: str, cands: Sequence[Candidate], size: int = SHORTLIST) -> list:
    """The candidates of ``cands`` (usable here, in preference order) worth timing for this call (module
    docstring); at least two where there are two, so that a choice is measured, not assumed."""
    measured = priors.measured(op)
    if not measured or len(cands) <= 2:
        return list(cands)
    names = [c.name for c in cands]
    ranked = [n for n in priors.ranking(op, key) if n in names]
    default = next((c.name for c in cands if not c.profiled_only), names[-1])
    keep = set(ranked[:size]) | {default} | {n for n in names if n not in measured}
    for extra in ranked[size:] + names:   # a lone default: the next best as well
        if len(keep) >= 2:
            break
        keep.add(extra)
    return [c for c in cands if c.name in keep]
