"""Replay recorded sessions through the policy node from your own tests (pytest or plain Python).

    from phyai_ros.testing import PolicyNode, replay

    def test_pick_session(tmp_path):
        with PolicyNode("config/my_robot.yaml", overrides={"model.checkpoint": CKPT}) as node:
            result = replay("bags/pick_001", node)               # deterministic stepped mode
        assert result.complete and result.accounting.ok          # every message used/superseded/stale/rejected
        assert result.node_counters["deadline_misses"] == 0
        chunks = result.chunk_data                               # [phyai_ros.messages.ChunkData]
        assert all(c.actions.shape == (50, 7) for c in chunks)

``PolicyNode`` starts ``phyai_ros.node.main`` in a subprocess (``use_sim_time`` on; in stepped mode
one /diagnostics report per tick) and stops it on exit; ``replay`` plays a rosbag2 into it and
returns a ``ReplayResult``: ``chunks``, ``margins``, ``commands``, ``diagnostics`` (lists of
``Received`` with ``.msg`` as Python objects), ``events``, ``accounting`` (per topic: played =
used + superseded + stale + rejected + not_played), ``node_counters`` (the node's counter
increments), and, with ``out=``, an output bag for ``report``.  Stepped mode: with the node's
``model.noise_seed`` fixed, a fresh node gives identical chunks on every run.

For trying it without your own model: ``make_small_checkpoint`` writes a small random-weight pi0.5
and ``require_tokenizer`` finds the fixture tokenizer (or skips the test); ``make_demo_bag`` (from
``phyai_ros.replay.demo_bag``) writes a synthetic session.  ``pytest_plugins =
["phyai_ros.testing"]`` adds the ``policy_node`` fixture factory.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Mapping, Optional, Sequence

from phyai_ros.replay.nodeproc import PACKAGE_ROOT, PolicyNodeProcess, default_params_file
from phyai_ros.replay.player import ReplayOptions, ReplayResult

__all__ = ["PolicyNode", "replay", "make_small_checkpoint", "small_model_config", "tokenizer_path",
           "require_tokenizer", "ReplayResult", "ReplayOptions", "policy_node"]


# ----------------------------------------------------------------------------- model files
def fixtures_dir() -> Path:
    env = os.environ.get("PHYAI_PARITY_FIXTURES")
    return Path(env) if env else PACKAGE_ROOT.parent / "shared" / "fixtures" / "lerobot_parity"


def tokenizer_path() -> Optional[Path]:
    """The fixture SentencePiece model (``$PHYAI_PARITY_FIXTURES/tokenizer/tokenizer.model``), or None."""
    p = fixtures_dir() / "tokenizer" / "tokenizer.model"
    return p if p.is_file() else None


def require_tokenizer() -> Path:
    """The fixture tokenizer, or ``pytest.skip`` with the reason."""
    p = tokenizer_path()
    if p is None:
        import pytest
        pytest.skip(f"no tokenizer at {fixtures_dir() / 'tokenizer' / 'tokenizer.model'} "
                    "(set PHYAI_PARITY_FIXTURES to the lerobot_parity fixture folder)")
    return p


def small_model_config(horizon: int = 50, image_size: int = 224, token_budget: int = 64, policy: str = "pi05"):
    """A small pi0.5 or pi0 (parity-fixture sizes: VLM 128x2, expert 64x2, SigLIP 64x2 at 224 px, vocab 1024,
    64-token prompt): one CPU inference takes ~50-100 ms on 2 cores."""
    from phyai_ros.models.common.config import GemmaConfig, SiglipConfig
    from phyai_ros.models.pi0 import Pi0Config
    from phyai_ros.models.pi05 import Pi05Config
    return {"pi05": Pi05Config, "pi0": Pi0Config}[policy](
        vlm=GemmaConfig(width=128, depth=2, mlp_dim=256, num_heads=8, num_kv_heads=1, head_dim=16),
        expert=GemmaConfig(width=64, depth=2, mlp_dim=128, num_heads=8, num_kv_heads=1, head_dim=16),
        siglip=SiglipConfig(width=64, depth=2, num_heads=4, mlp_dim=128, patch_size=14, image_size=image_size),
        vocab_size=1024, chunk_size=horizon, num_steps=10, token_budget=token_budget)


def make_small_checkpoint(directory, *, horizon: int = 50, state_dim: int = 8, action_dim: int = 7, seed: int = 0,
                          cameras: Sequence[str] = ("base_0_rgb", "left_wrist_0_rgb", "right_wrist_0_rgb"),
                          image_size: int = 224, token_budget: int = 64, policy: str = "pi05") -> Path:
    """Write a random-weight small pi0.5 (or, policy="pi0", pi0) checkpoint (LeRobot layout) into
    ``directory``; its chunk size must equal the node's ``control.horizon``, state/action dims its
    joint/action name counts."""
    import torch
    from phyai_ros.models import pi0, pi05
    directory = Path(directory)
    writer = {"pi05": pi05.make_random_checkpoint, "pi0": pi0.make_random_checkpoint}[policy]
    writer(directory, small_model_config(horizon, image_size, token_budget, policy), seed=seed,
                           dtype=torch.float32, std=0.1,
                           camera_names=tuple(cameras), state_dim=state_dim, action_dim=action_dim)
    return directory


# ----------------------------------------------------------------------------- the node
class PolicyNode(PolicyNodeProcess):
    """The policy node in a subprocess, ready to be replayed into.

    ``params_file``: default ``config/pi05_cpu_test.yaml``; ``checkpoint`` / ``tokenizer``: set
    ``model.checkpoint`` / ``model.tokenizer``; ``overrides``: more ``-p`` parameters; ``stepped``
    (default True): one /diagnostics report per control tick, which stepped replay needs (the
    node then needs ``control.dt`` >= 0.05, the smallest ``diagnostics.period`` it accepts); with
    ``stepped=False`` (real-time replay) it reports at 10 Hz."""

    def __init__(self, params_file=None, *, checkpoint=None, tokenizer=None,
                 overrides: Optional[Mapping[str, Any]] = None, remaps: Optional[Mapping[str, str]] = None,
                 stepped: bool = True, log_path=None):
        from phyai_ros.replay.nodeinfo import load_params_file
        params_file = Path(params_file) if params_file else default_params_file()
        ov: Dict[str, Any] = dict(overrides or {})
        if checkpoint is not None:
            ov["model.checkpoint"] = str(checkpoint)
        if tokenizer is not None:
            ov["model.tokenizer"] = str(tokenizer)
        if "diagnostics.period" not in ov:
            # stepped: one report per tick (needed); real time: 10 Hz, so the replay's session
            # counters end within 0.1 s of the last message
            ov["diagnostics.period"] = (ov.get("control.dt", load_params_file(params_file).get("control.dt", 0.05))
                                        if stepped else 0.1)
        super().__init__(params_file, overrides=ov, remaps=remaps, use_sim_time=True, log_path=log_path)


def replay(bag, node: PolicyNodeProcess, *, mode: str = "stepped", out=None, remaps: Optional[Mapping[str, str]] = None,
           topics: Optional[Sequence[str]] = None, exclude: Sequence[str] = (), clock_source: str = "auto",
           wait_node: float = 60.0, **options) -> ReplayResult:
    """Play ``bag`` into ``node`` and return what happened.

    ``mode``: 'stepped' (deterministic) or 'realtime' (``rate=`` to scale); ``out``: output bag folder
    to write (None: results in memory only); ``remaps``: {bag topic: node topic}; ``options``: more
    ``ReplayOptions`` fields (settle, preroll, tail, ...)."""
    from phyai_ros.replay.bagtypes import absolute_topic
    from phyai_ros.replay.cli import run_replay
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
            n = PolicyNode(*args, **kwargs)
            started.append(n)
            return n

        yield make
        for n in started:
            n.stop()
except ImportError:  # pragma: no cover - pytest is optional for plain-Python use
    pass
