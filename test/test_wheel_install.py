"""`pip install .` without ROS: the core installs from a wheel and runs from there, and only the node needs ROS.

A wheel is built (setup.py) from a copy of the source tree and installed into an empty folder; from outside the
source tree, with only that folder on PYTHONPATH (the venv still provides torch and friends), `predict` runs the
LeRobot parity fixture, every module imports with ROS made unimportable except the ROS-only `phyai_ros.node` modules
(main, parameters: the ROS declaration of the table in `phyai_ros.parameters`, qos), which say clearly that they need
ROS, and the kernels are `phyai_ros.kernels` as in the checkout and the colcon install.
"""
import json
import os
import re
import subprocess
import sys
import textwrap
from importlib import metadata
from importlib.util import find_spec
from pathlib import Path

import pytest

from phyai_ros.testing import fixtures_dir
from test_install_layout import REPO, copy_source_tree, package_py_files

SCRIPTS = ("phyai-predict", "phyai-replay", "phyai-report", "phyai-demo-bag")

# Imports every module of the installed package with ROS blocked (rclpy, message and interface packages, ament,
# cv_bridge, the generated phyai_ros.msg); prints {module: error} for those that fail, where three load from, and
# what making a message says.
IMPORT_ALL_WITHOUT_ROS = textwrap.dedent("""
    import importlib, importlib.abc, json, pathlib, sys
    ROS = {"rclpy", "rcl_interfaces", "rosidl_runtime_py", "rosgraph_msgs", "builtin_interfaces", "std_msgs",
           "sensor_msgs", "diagnostic_msgs", "trajectory_msgs", "cv_bridge", "ament_index_python", "launch",
           "launch_ros", "rpyutils"}

    class BlockRos(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            top = name.split(".")[0]
            if top in ROS or top.endswith(("_msgs", "_interfaces")) or name.startswith("phyai_ros.msg"):
                raise ModuleNotFoundError(f"No module named {name!r} (ROS blocked for the test)", name=name)

    sys.meta_path.insert(0, BlockRos())
    root = pathlib.Path(sys.argv[1]) / "phyai_ros"
    failed = {}
    for path in sorted(root.rglob("*.py")):
        parts = path.relative_to(root.parent).with_suffix("").parts
        if parts[-1] == "__main__":
            continue
        name = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        try:
            importlib.import_module(name)
        except Exception as exc:
            failed[name] = [type(exc).__name__, isinstance(exc, ImportError), str(exc)]
    files = {m: sys.modules[m].__file__ for m in ("phyai_ros.control", "phyai_ros.predict", "phyai_ros.replay.report")}
    try:
        sys.modules["phyai_ros.messages"].ns_to_time(0)
        make_message = "made a message without ROS"
    except ImportError as exc:
        make_message = str(exc)
    print(json.dumps({"failed": failed, "files": files, "make_message": make_message}))
""")


@pytest.fixture(scope="module")
def target(tmp_path_factory) -> Path:
    """An empty folder with the package installed from a wheel built off a copy of the source tree."""
    setuptools = tuple(int(n) for n in metadata.version("setuptools").split(".")[:2])
    if setuptools < (70, 1) and find_spec("wheel") is None:  # e.g. a distro Python (colcon test on the robot)
        pytest.skip(f"setuptools {setuptools} builds wheels only with the wheel package, which is not installed")
    tmp = tmp_path_factory.mktemp("wheel")
    src, wheels, target = copy_source_tree(tmp / "src"), tmp / "wheels", tmp / "target"
    pip(tmp, "wheel", "--no-deps", "--no-build-isolation", "-w", str(wheels), str(src))
    (wheel,) = wheels.glob("phyai_ros-*.whl")
    pip(tmp, "install", "--no-deps", "--target", str(target), str(wheel))
    return target


def pip(cwd: Path, *args: str) -> None:
    run = subprocess.run([sys.executable, "-m", "pip", *args], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, f"pip {args[0]} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"


def run_installed(target: Path, args, cwd: Path) -> subprocess.CompletedProcess:
    """Run a command with only the install folder on PYTHONPATH, outside the source tree."""
    env = dict(os.environ, PYTHONPATH=str(target))
    return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)


def test_wheel_has_the_package_with_its_kernels_and_the_console_scripts(target):
    assert package_py_files(target) == package_py_files(REPO)
    assert not (target / "kernels").exists()
    # the shipped operator profiles, found by device name from the installed package
    assert {p.name for p in (target / "phyai_ros" / "profiles").glob("*.json")} == \
        {p.name for p in (REPO / "profiles").glob("*.json")} != set()
    for name in SCRIPTS:
        assert (target / "bin" / name).is_file(), name


def test_predict_runs_from_the_wheel_outside_the_source_tree(target, tmp_path):
    f = fixtures_dir()
    pi05 = f / "pi05"
    if not (pi05 / "expected.safetensors").is_file():
        pytest.skip(f"LeRobot parity fixtures not found at {f}")
    run = run_installed(target, [
        sys.executable, "-m", "phyai_ros.predict", "--checkpoint", str(pi05 / "checkpoint"),
        "--tokenizer", str(f / "tokenizer" / "tokenizer.model"), "--norm-stats", str(pi05 / "norm_stats.json"),
        "--inputs", str(pi05 / "inputs.safetensors"), "--tasks-json", str(pi05 / "inputs.json"),
        "--expected", str(pi05 / "expected.safetensors"), "--output", str(tmp_path / "actions.safetensors")],
        cwd=tmp_path)
    assert run.returncode == 0, run.stdout + run.stderr
    found = re.search(r"max-abs actions vs actions\.unnormalized: (\S+)", run.stdout)
    assert found, run.stdout
    assert float(found.group(1)) < 1e-4
    help_run = run_installed(target, [str(target / "bin" / "phyai-predict"), "--help"], cwd=tmp_path)
    assert help_run.returncode == 0 and "--checkpoint" in help_run.stdout, help_run.stderr


def test_only_the_node_needs_ros(target, tmp_path):
    run = run_installed(target, [sys.executable, "-c", IMPORT_ALL_WITHOUT_ROS, str(target)], cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # the node and its QoS profiles are ROS-only modules; nothing else may need ROS to import
    assert sorted(result["failed"]) == ["phyai_ros.node.main", "phyai_ros.node.parameters", "phyai_ros.node.qos"], \
        result["failed"]
    for module, (kind, is_import_error, message) in result["failed"].items():
        assert kind == "RosUnavailableError" and is_import_error
        assert message.startswith(f"{module} needs ROS 2 (rclpy): install ROS 2 Jazzy"), message
    for module, path in result["files"].items():
        assert path.startswith(str(target)), (module, path)
    assert result["make_message"].startswith("phyai_ros.messages needs ROS 2 (rclpy)"), result["make_message"]
