"""Replay recorded sessions through the policy node from your own tests (pytest or plain Python).

    from phyai_ros.testing import PolicyNode, replay

    def test_pick_session(tmp_path):
        with PolicyNode("config/my_robot.yaml", overrides={"model.checkpoint": CKPT}) as node:
            result = replay("bags/pick_001", node)               # deterministic stepped mode
        assert result.complete and result.accounting.ok          # every message used/superseded/stale/rejected
        assert result.node_counters["deadline_misses"] == 0
        chunks = result.chunk_data                               # [phyai_ros.control.ActionChunk]
        assert all(c.actions.shape == (50, 7) for c in chunks)

``PolicyNode`` starts ``phyai_ros.node.main`` in a subprocess (``use_sim_time`` on; in stepped mode
one /diagnostics report per tick) and stops it on exit; ``replay`` plays a rosbag2 into it and
returns a ``ReplayResult``: ``chunks``, ``margins``, ``commands``, ``diagnostics`` (lists of
``Received`` with ``.msg`` as Python objects), ``events``, ``accounting`` (per topic: played =
used + superseded + stale + rejected + not_played), ``node_counters`` (the node's counter
increments), and, with ``out=``, an output bag for ``report``.  Stepped mode: with the node's
``model.noise_seed`` fixed, a fresh node gives identical chunks on every run.

For trying it without your own model (``phyai_ros.fixtures``, re-exported here): ``make_small_checkpoint`` writes a small random-weight pi0.5
and ``require_tokenizer`` finds the fixture tokenizer (or skips the test); ``make_demo_bag`` (from
``phyai_ros.replay.demo_bag``) writes a synthetic session.  ``pytest_plugins =
["phyai_ros.testing"]`` adds the ``policy_node`` fixture factory.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Mapping, Optional, Sequence

from phyai_ros.fixtures import fixtures_dir, make_small_checkpoint, require_tokenizer, tokenizer_path

if TYPE_CHECKING:
    from phyai_ros.replay.nodeproc import PolicyNode, PolicyNodeProcess
    from phyai_ros.replay.player import ReplayOptions, ReplayResult

# The replay tools need rosbags (absent on the GPU machines): imported when first used, so the fixture helpers
# above import anywhere.
_LAZY = {"PolicyNode": "phyai_ros.replay.nodeproc", "PolicyNodeProcess": "phyai_ros.replay.nodeproc",
         "ReplayOptions": "phyai_ros.replay.player", "ReplayResult": "phyai_ros.replay.player"}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")

__all__ = ["PolicyNode", "replay", "make_small_checkpoint", "tokenizer_path", "fixtures_dir",
           "require_tokenizer", "ReplayResult", "ReplayOptions", "policy_node"]


def replay(bag, node: PolicyNodeProcess, *, mode: str = "stepped", out=None, remaps: Optional[Mapping[str, str]] = None,
           topics: Optional[Sequence[str]] = None, exclude: Sequence[str] = (), clock_source: str = "auto",
           wait_node: float = 180.0, **options) -> ReplayResult:
    """Play ``bag`` into ``node`` and return what happened.

    ``mode``: 'stepped' (deterministic) or 'realtime' (``rate=`` to scale); ``out``: output bag folder
    to write (None: results in memory only); ``remaps``: {bag topic: node topic}; ``options``: more
    ``ReplayOptions`` fields (settle, preroll, tail, ...). ``wait_node``: seconds for the node to start and
    follow /clock; generous, since a test suite on a loaded two-core machine has seen node starts past 60 s
    (a longer wait only delays the report of a node that never starts)."""
    from phyai_ros.replay.bagtypes import absolute_topic
    from phyai_ros.replay.cli import run_replay
    from phyai_ros.replay.player import ReplayOptions
    opts = ReplayOptions(mode=mode, startup_timeout=wait_node, **options)
    remaps = {absolute_topic(k): absolute_topic(v) for k, v in (remaps or {}).items()}
    return run_replay(bag, out=out, options=opts, remaps=remaps, topics=topics, exclude=exclude,
                      clock_source=clock_source, node_name=node.name, node_info=node.info, node_process=node,
                      wait_node=wait_node, log=lambda m: None)


# ----------------------------------------------------------------------------- pytest
try:
    import pytest

    @pytest.fixture
    def policy_node():
        """Factory fixture: ``node = policy_node(params_file=..., overrides=...)``; stopped after the test."""
        started = []

        def make(*args, **kwargs) -> PolicyNode:
            from phyai_ros.replay.nodeproc import PolicyNode
            n = PolicyNode(*args, **kwargs)
            started.append(n)
            return n

        yield make
        for n in started:
            n.stop()
except ImportError:  # pragma: no cover - pytest is optional for plain-Python use
    pass
