"""Shared test setup: DDS isolation per run, and the `gpu` marker's skip rule."""
import os
import random
import tempfile

import pytest

# Keep discovery on loopback, and give every test run its own DDS domain so
# parallel runs on one machine never see each other's nodes.
os.environ.setdefault("ROS_AUTOMATIC_DISCOVERY_RANGE", "LOCALHOST")
os.environ.setdefault("ROS_DOMAIN_ID", str(random.Random(os.getpid()).randint(1, 101)))
# The start-up autotune's cache of this run (and of each xdist worker) alone: a test never reads what an earlier
# run, another branch's kernels or the user's node left in ~/.cache/phyai_ros/profiles, nor writes there.
os.environ.setdefault("PHYAI_PROFILE_CACHE", tempfile.mkdtemp(prefix="phyai_profile_cache_"))


def _cuda_available() -> bool:
    """True when torch sees a CUDA device."""
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA device (gpu marker)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


# Without a GPU the Triton kernels are tested through Triton's interpreter, which must be switched on
# before triton is first imported (by any test module).
if not _cuda_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")


# MiniCPM-Robot set A for its parity and GPU tests (one loading, test/fixture_sets.py's)
@pytest.fixture(scope="module")
def minicpm_set():
    """MiniCPM-Robot set A's (expected, inputs, config.json), as exp / inp / meta below (a module's own fixture of
    the same name takes precedence)."""
    from fixture_sets import load_minicpm_set
    return load_minicpm_set()


@pytest.fixture(scope="module")
def exp(minicpm_set):
    return minicpm_set[0]


@pytest.fixture(scope="module")
def inp(minicpm_set):
    return minicpm_set[1]


@pytest.fixture(scope="module")
def meta(minicpm_set):
    return minicpm_set[2]
