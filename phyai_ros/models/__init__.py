"""The registry of policy families: ``model.type`` -> the family's adapter class (phyai_ros/models/contract.py).

A family is one folder under ``phyai_ros/models/`` and one line in ``FAMILIES``; nothing else shared changes,
since every shared tool asks the adapter class (the contract) what differs by family. A family living outside
this package registers without touching it: a ``phyai_ros.families`` entry point of an installed package
(name = the family, value = ``module:Class``), or ``PHYAI_ROS_FAMILIES="name=module:Class[,...]"`` in the
environment (tests, a robot's own family in development). Entries are strings, so listing the families imports
no model code.
"""
from __future__ import annotations

import importlib
import os
from functools import lru_cache
from importlib.metadata import entry_points
from pathlib import Path
from typing import Dict, List

from phyai_ros.models.files import fixed_file, read_json
from .contract import PolicyAdapter, check_family

FAMILIES: Dict[str, str] = {
    "pi05": "phyai_ros.models.pi.pi05.adapter:Pi05Adapter",
    "pi0": "phyai_ros.models.pi.pi0.adapter:Pi0Adapter",
    "groot_n17": "phyai_ros.models.groot_n17.adapter:GrootAdapter",
    "cosmos3": "phyai_ros.models.cosmos3.adapter:Cosmos3Adapter",
    "minicpm_robot": "phyai_ros.models.minicpm.adapter:MiniCpmAdapter",
}
PLUGIN_ENV = "PHYAI_ROS_FAMILIES"
ENTRY_POINT_GROUP = "phyai_ros.families"


def registered() -> Dict[str, str]:
    """family name -> "module:Class": the built-in families, then installed entry points, then the environment's.
    A plugin may not take a built-in family's name."""
    table = dict(FAMILIES)
    plugins = [(ep.name, ep.value) for ep in entry_points(group=ENTRY_POINT_GROUP)]
    for item in filter(None, (s.strip() for s in os.environ.get(PLUGIN_ENV, "").split(","))):
        name, sep, target = item.partition("=")
        if not sep or ":" not in target:
            raise ValueError(f"{PLUGIN_ENV}: {item!r} is not name=module:Class")
        plugins.append((name.strip(), target.strip()))
    for name, target in plugins:
        if name in FAMILIES:
            raise ValueError(f"policy family plugin {name!r} ({target}) takes a built-in family's name")
        table[name] = target
    return table


def family_names() -> List[str]:
    return list(registered())


def family(name: str) -> type:
    """The adapter class of family ``name`` (ValueError naming the registered ones), checked against the
    contract."""
    table = registered()
    if name not in table:
        raise ValueError(f"model type {name!r} is not available (registered: {', '.join(table)})")
    return _load(name, table[name])


def import_target(target: str) -> object:
    """What a ``"module:Name"`` string names (a registry entry, the serve engine's class): the module imported,
    its attribute read; ValueError for a string of another form."""
    module, sep, name = target.partition(":")
    if not (sep and module and name) or ":" in name:
        raise ValueError(f"{target!r} is not module:Class")
    return getattr(importlib.import_module(module), name)


@lru_cache(maxsize=None)
def _load(name: str, target: str) -> type:
    cls = import_target(target)
    check_family(cls)
    if cls.family != name:
        raise ValueError(f"{target} is registered as {name!r} but says it is family {cls.family!r}")
    return cls


def checkpoint_type(checkpoint) -> str:
    """The family that loads a checkpoint folder: the first whose ``matches`` says so (by default its config.json
    ``type`` is one of the family's ``checkpoint_types``; families with a ``matches`` of their own first)."""
    folder = Path(checkpoint)
    if not folder.is_dir():
        raise FileNotFoundError(f"checkpoint folder not found: {folder}")
    # A family that says how it knows its own folders (its own ``matches``) is asked before those that go by
    # config.json's type alone: an untyped config.json (pi0.5's parity fixtures) must not claim a folder that a
    # family recognises by its other files.
    names = sorted(registered(), key=lambda n: family(n).matches.__func__ is PolicyAdapter.matches.__func__)
    for name in names:
        if family(name).matches(folder):
            return name
    config = fixed_file(folder, "config.json")
    what = f"type {read_json(config).get('type', '')!r}" if config.is_file() else "no config.json"
    raise ValueError(f"{folder}: no registered policy family loads it ({what}; registered: "
                     f"{', '.join(registered())})")


def family_for_checkpoint(checkpoint) -> type:
    return family(checkpoint_type(checkpoint))


__all__ = ["FAMILIES", "PLUGIN_ENV", "ENTRY_POINT_GROUP", "PolicyAdapter", "registered", "family_names", "family",
           "checkpoint_type", "family_for_checkpoint", "import_target"]
