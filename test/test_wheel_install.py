"""`pip install .` without ROS: the core installs from a wheel and runs from there, and only the node needs ROS.

A wheel is built (setup.py) from a copy of the source tree and installed into an empty folder; from outside the
source tree, with only that folder on PYTHONPATH (the venv still provides torch and friends), `predict` runs the
LeRobot parity fixture, every module imports with ROS made unimportable except the ROS-only `phyai_ros.node.main`,
`phyai_ros.node.parameters` and `phyai_ros.node.qos`, which say clearly that they need ROS, and the kernels are `phyai_ros.kernels` as in the checkout and the colcon install.
The wheel carries the message definitions and the parameter files, its requirements are the ones
requirements.lock pins, and a missing `bags` extra is named.

Then what a user without ROS does: a new virtual environment and `pip install '<source>[bags]'` (about a minute
and a half here, most of it torch; skipped when no package index can be reached): the lock's torch build, and
the console scripts `phyai-demo-bag` and `phyai-report` working from there, `phyai-replay` saying it needs ROS.
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
from test_replay_offline import _write_output_bag

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
    assert "pi0.5, pi0, GR00T N1.7 and Cosmos3" in " ".join(help_run.stdout.split())   # every family it runs


def test_only_the_node_needs_ros(target, tmp_path):
    run = run_installed(target, [sys.executable, "-c", IMPORT_ALL_WITHOUT_ROS, str(target)], cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    # the node, its parameter declarations and its QoS profiles are ROS-only modules; nothing else may need ROS
    assert sorted(result["failed"]) == ["phyai_ros.node.main", "phyai_ros.node.parameters", "phyai_ros.node.qos"], \
        result["failed"]
    for module, (kind, is_import_error, message) in result["failed"].items():
        assert kind == "RosUnavailableError" and is_import_error
        assert message.startswith(f"{module} needs ROS 2 (rclpy): install ROS 2 Jazzy"), message
    for module, path in result["files"].items():
        assert path.startswith(str(target)), (module, path)
    assert result["make_message"].startswith("phyai_ros.messages needs ROS 2 (rclpy)"), result["make_message"]


def test_wheel_carries_the_messages_and_the_parameter_files(target, tmp_path):
    share = target / "phyai_ros" / "share"
    assert {p.name for p in (share / "msg").glob("*.msg")} == {p.name for p in (REPO / "msg").glob("*.msg")} != set()
    assert {p.name for p in (share / "config").iterdir()} == {p.name for p in (REPO / "config").iterdir()}
    code = ("from phyai_ros.replay.bagtypes import msg_dir; from phyai_ros.replay.nodeproc import default_params_file;"
            "print(msg_dir()); print(default_params_file())")
    run = run_installed(target, [sys.executable, "-c", code], cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == [str(share / "msg"), str(share / "config" / "pi05_cpu_test.yaml")]


def lock_pins() -> dict:
    """name (normalized) -> version, from requirements.lock."""
    pins = {}
    for line in (REPO / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, _, version = line.partition("==")
            pins[re.sub(r"[-_.]+", "-", name.split("[")[0]).lower()] = version.strip()
    return pins


def test_wheel_requirements_are_the_locked_versions(target):
    """Every requirement of the package and of its CPU extras is satisfied by the version requirements.lock pins
    (the set CI runs), and torch is exactly the lock's, so `pip install .` cannot trade it for another build. The
    flashinfer extra is GPU-only and the cosmos3-reference test extra pins a reference: neither is in the CPU lock."""
    from packaging.requirements import Requirement
    (dist,) = [d for d in metadata.distributions(path=[str(target)]) if d.metadata["Name"] == "phyai_ros"]
    pins = lock_pins()
    checked = set()
    for text in dist.requires:
        req = Requirement(text)
        extra = re.search(r"extra == \"([\w-]+)\"", str(req.marker)) if req.marker else None
        if extra and extra.group(1) in ("flashinfer", "cosmos3-reference"):
            continue   # GPU-only, and a test-only reference (the versions the Cosmos3 fixtures were made with)
        name = re.sub(r"[-_.]+", "-", req.name).lower()
        assert name in pins, f"{req} is not pinned in requirements.lock"
        assert req.specifier.contains(pins[name], prereleases=True), f"{req} excludes the lock's {name}=={pins[name]}"
        checked.add(name)
    assert str(next(Requirement(t) for t in dist.requires if t.startswith("torch")).specifier) == f"=={pins['torch']}"
    assert {"torch", "numpy", "rosbags", "matplotlib", "opencv-python-headless", "triton", "ruff"} <= checked


def test_a_missing_extra_is_named(target, tmp_path):
    """Without rosbags (the `bags` extra), the report and the bag generator say which extra to install."""
    bag = _write_output_bag(tmp_path / "out", n_chunks=4)
    block = ("import importlib.abc, runpy, sys\n"
             "class Block(importlib.abc.MetaPathFinder):\n"
             "    def find_spec(self, name, path=None, target=None):\n"
             "        if name.split('.')[0] in ('rosbags', 'cv2', 'matplotlib'):\n"
             "            raise ModuleNotFoundError(f'No module named {name!r}', name=name)\n"
             "sys.meta_path.insert(0, Block())\n"
             "sys.argv = sys.argv[1:]\n"
             "runpy.run_module(sys.argv[0], run_name='__main__')\n")
    for module, args in (("phyai_ros.replay.report", [str(bag)]),
                         ("phyai_ros.replay.demo_bag", [str(tmp_path / "bag")])):
        run = run_installed(target, [sys.executable, "-c", block, module, *args], cwd=tmp_path)
        assert run.returncode == 1, (module, run.stdout, run.stderr)
        assert "pip install 'phyai_ros[bags]'" in run.stderr and "Traceback" not in run.stderr, (module, run.stderr)
    help_run = run_installed(target, [sys.executable, "-c", block, "phyai_ros.replay.demo_bag", "--help"], cwd=tmp_path)
    assert help_run.returncode == 0 and "usage: demo_bag" in help_run.stdout, help_run.stderr


# ----------------------------------------------------------------------------- a fresh virtual environment
OFFLINE = ("Could not fetch URL", "NewConnectionError", "Temporary failure in name resolution", "Network is unreachable",
           "No matching distribution found")


@pytest.fixture(scope="module")
def fresh_venv(tmp_path_factory) -> Path:
    """A new virtual environment (no ROS, nothing preinstalled) with `pip install '<copy of the source>[bags]'`."""
    tmp = tmp_path_factory.mktemp("fresh")
    src, venv = copy_source_tree(tmp / "src"), tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    run = subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--disable-pip-version-check",
                          f"{src}[bags]"], cwd=tmp, capture_output=True, text=True, timeout=1500)
    if run.returncode != 0 and any(s in run.stdout + run.stderr for s in OFFLINE):
        pytest.skip("no package index reachable for a fresh install:\n" + (run.stdout + run.stderr)[-1500:])
    assert run.returncode == 0, f"pip install failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return venv


def fresh_run(venv: Path, args, cwd: Path) -> subprocess.CompletedProcess:
    """A command of the fresh environment, outside the source tree, nothing of this one on the path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "AMENT_PREFIX_PATH", "VIRTUAL_ENV")}
    env["PATH"] = f"{venv / 'bin'}:{env.get('PATH', '')}"
    return subprocess.run([str(a) for a in args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600)


def test_a_fresh_install_keeps_the_locks_torch(fresh_venv, tmp_path):
    import torch
    run = fresh_run(fresh_venv, [fresh_venv / "bin" / "python", "-c", "import torch; print(torch.__version__)"],
                    tmp_path)
    assert run.returncode == 0, run.stderr
    # the build this environment runs from the lock (here the CPU build: no CUDA libraries pulled in)
    assert run.stdout.strip() == torch.__version__ and torch.__version__.startswith(lock_pins()["torch"])
    if torch.version.cuda is None:
        dists = fresh_run(fresh_venv, [fresh_venv / "bin" / "python", "-m", "pip", "list", "--format=freeze"], tmp_path)
        assert not [d for d in dists.stdout.split() if d.lower().startswith("nvidia")], dists.stdout


def test_console_scripts_work_after_a_fresh_install(fresh_venv, tmp_path):
    bin_ = fresh_venv / "bin"
    for script in ("phyai-demo-bag", "phyai-report", "phyai-replay", "phyai-predict"):
        run = fresh_run(fresh_venv, [bin_ / script, "--help"], tmp_path)
        assert run.returncode == 0 and "usage:" in run.stdout and "Traceback" not in run.stderr, (script, run.stderr)
    made = fresh_run(fresh_venv, [bin_ / "phyai-demo-bag", tmp_path / "session", "--duration", "1"], tmp_path)
    assert made.returncode == 0 and "wrote" in made.stdout, made.stdout + made.stderr
    assert (tmp_path / "session" / "metadata.yaml").is_file()
    out = _write_output_bag(tmp_path / "out", n_chunks=40)
    rep = fresh_run(fresh_venv, [bin_ / "phyai-report", out], tmp_path)
    assert rep.returncode == 0 and "OK: environment-bound" in rep.stdout, rep.stdout + rep.stderr
    assert (out / "report" / "report.html").is_file()
    # the replay plays into a ROS node: it says so first (not a missing config file, not a traceback)
    replay = fresh_run(fresh_venv, [bin_ / "phyai-replay", tmp_path / "session", "--start-node"], tmp_path)
    assert replay.returncode == 1 and "needs ROS 2" in replay.stderr and "Traceback" not in replay.stderr, \
        replay.stderr
