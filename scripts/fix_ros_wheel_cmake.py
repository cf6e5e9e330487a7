"""Point the ROS wheels' exported CMake files at this environment.

The ros-jazzy-* wheels were built in a manylinux image, and their exported
``*.cmake`` files still name that image's Python include folder, numpy include
folder and site-packages. CMake rejects imported targets whose include paths do
not exist, so building our messages against the wheels needs those paths
rewritten to the running interpreter's. Idempotent; rerun after installing more
ROS message wheels.
"""
import sys
import sysconfig
from pathlib import Path

import numpy

BUILD_PREFIX = "/opt/python/cp311-cp311"


def replacements() -> list[tuple[str, str]]:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    old_site = f"{BUILD_PREFIX}/lib/{version}/site-packages"
    paths = sysconfig.get_paths()
    # Longest first, so the numpy path is not half-rewritten by the site-packages rule.
    return [
        (f"{old_site}/numpy/_core/include", numpy.get_include()),
        (old_site, paths["purelib"]),
        (f"{BUILD_PREFIX}/include/{version}", paths["include"]),
    ]


def fix(prefix: Path) -> int:
    rules = replacements()
    changed = 0
    for folder in (prefix / "share", prefix / "lib" / "cmake"):
        for path in folder.rglob("*.cmake"):
            text = path.read_text()
            if BUILD_PREFIX not in text:
                continue
            new = text
            for old, repl in rules:
                new = new.replace(old, repl)
            if new != text:
                path.write_text(new)
                changed += 1
    return changed


if __name__ == "__main__":
    n = fix(Path(sys.prefix))
    print(f"fix_ros_wheel_cmake: rewrote {n} file(s) under {sys.prefix}")
