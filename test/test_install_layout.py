"""The package installs like a colcon/ament_cmake build would on the robot, and imports from there.

Builds the full package (messages + Python sources + kernels + launch/config + executables) from a copy of the
source tree into a temporary prefix, with the environment's ROS (the venv's wheels here; apt on the robot), then
imports the installed `phyai_ros` with the source tree off the path. It checks the layout the robot gets:
`phyai_ros.msg` next to the Python sources, the kernels reached as `phyai_ros.kernels` (never as a bare
top-level `kernels`), `share/phyai_ros/{launch,config}` and `lib/phyai_ros/<executables>` for `ros2 run`.
"""
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
VENV = Path(sys.prefix)


def copy_source_tree(dest: Path) -> Path:
    """Copy what git tracks or would track (no build outputs, no symlinks) to ``dest``: what a clone has."""
    files = subprocess.run(["git", "ls-files", "-co", "--exclude-standard"], cwd=REPO, check=True,
                           capture_output=True, text=True).stdout.split()
    for rel in files:
        path = REPO / rel
        if path.is_symlink() or not path.is_file():
            continue
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest / rel)
    return dest


def package_py_files(root: Path) -> set:
    """The package's Python files under ``root`` (a site-packages folder or, with the kernels mapped to
    ``phyai_ros/kernels``, the source tree), less what rosidl generates (``phyai_ros/msg``)."""
    files = {p.relative_to(root).as_posix() for p in (root / "phyai_ros").rglob("*.py")}
    if root == REPO:
        files |= {f"phyai_ros/kernels/{p.relative_to(REPO / 'kernels').as_posix()}"
                  for p in (REPO / "kernels").rglob("*.py")}
    return {f for f in files if not f.startswith("phyai_ros/msg/")}


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    if shutil.which("cmake") is None:
        pytest.skip("cmake not available")
    tmp = tmp_path_factory.mktemp("install")
    src, build, prefix = copy_source_tree(tmp / "src"), tmp / "build", tmp / "prefix"
    env = dict(os.environ, AMENT_PREFIX_PATH=str(VENV), PATH=f"{VENV / 'bin'}:{os.environ['PATH']}")
    for cmd in (["cmake", "-S", str(src), "-B", str(build), f"-DCMAKE_INSTALL_PREFIX={prefix}",
                 f"-DPython3_EXECUTABLE={sys.executable}", "-DBUILD_TESTING=OFF"],
                ["cmake", "--build", str(build), "-j2"], ["cmake", "--install", str(build)]):
        run = subprocess.run(cmd, env=env, capture_output=True, text=True)
        assert run.returncode == 0, f"{' '.join(cmd[:2])} failed:\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    site = prefix / Path(sysconfig.get_paths()["purelib"]).relative_to(sys.prefix)
    return prefix, site


def test_installed_tree_has_what_ros2_run_and_launch_need(installed):
    prefix, site = installed
    for rel in ("share/phyai_ros/package.xml", "share/phyai_ros/launch/pi05_thor.launch.py",
                "share/phyai_ros/config/pi05_thor.yaml", "share/phyai_ros/config/pi05_cpu_test.yaml",
                "lib/phyai_ros/onboard_node", "lib/phyai_ros/predict", "lib/phyai_ros/replay",
                "lib/phyai_ros/report", "share/phyai_ros/launch/replay.launch.py"):
        assert (prefix / rel).is_file(), rel
    assert os.access(prefix / "lib/phyai_ros/onboard_node", os.X_OK)
    assert (site / "phyai_ros" / "kernels" / "rms_norm.py").is_file()
    assert not (site / "kernels").exists()
    assert (site / "phyai_ros" / "profiles" / "h200.json").is_file()   # shipped operator profiles
    assert package_py_files(site) == package_py_files(REPO)  # the same files as the source tree and the wheel


def test_installed_package_imports_without_the_source_tree(installed):
    _, site = installed
    code = ("import sys, phyai_ros, phyai_ros.kernels.rms_norm as k, phyai_ros.node.parameters;"
            "import phyai_ros.kernels.candidates.expert_layer, phyai_ros.layers.dispatch;"
            "from phyai_ros.msg import ActionChunk, ControlMargin;"
            "import importlib.util as u;"
            "print(phyai_ros.__file__); print(k.__file__); print(u.find_spec('kernels'))")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PYTHONPATH"] = str(site)
    run = subprocess.run([sys.executable, "-c", code], cwd="/", env=env, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr[-3000:]
    init, kernel, bare = run.stdout.split("\n")[:3]
    assert init.startswith(str(site)) and kernel.startswith(str(site))
    assert bare == "None" or "site-packages/kernels" in bare  # a PyPI `kernels` may exist; ours is not it
