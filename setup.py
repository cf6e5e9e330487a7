"""pip-installable core of phyai_ros: ``pip install .`` works without ROS.

It installs the Python package: runtime, models, layers with the Triton kernels (the top-level ``kernels/``
folder becomes ``phyai_ros.kernels``, as CMakeLists.txt installs it) and the shipped operator profiles
(``profiles/*.json`` as ``phyai_ros/profiles``), control loop, ``predict`` and the replay
tools, for offline evaluation, benchmarks and cloud rollouts; the message definitions and the parameter files
as package data (``msg/*.msg`` as ``phyai_ros/share/msg``, ``config/`` as ``phyai_ros/share/config``: the
colcon install's ``share/phyai_ros``), which bags, reports and ``replay --start-node`` read.

Versions: the ones requirements.lock pins (what CI runs) satisfy every requirement here, and torch is that
one: ``pip install .`` must not trade the lock's torch for another build (test/test_wheel_install.py checks
both).  A CPU-only machine installs torch's CPU build first (README "Without ROS").  The ROS node (``phyai_ros.node``) also needs
ROS 2 Jazzy and the messages rosidl generates, which only the colcon build (package.xml, ament_cmake) makes:
on the robot use README "On the robot"; without ROS, importing the node raises one clear
``phyai_ros.RosUnavailableError``.

Extras:
  ros         nothing to pip-install: ROS 2 comes from apt (or the ros-jazzy-* wheels, scripts/setup_env.sh)
              and the messages from colcon
  bags        rosbags and friends: demo bags, replay scans, HTML reports (phyai-report)
  gpu         triton for the fused kernels (without it the layers fall back to torch)
  flashinfer  FlashInfer 0.6.3: attention / RMSNorm / GeGLU candidates a device profile may pick
  dev         pytest and the pinned ruff that scripts/test.sh runs
  cosmos3-reference  diffusers 0.42.1 + transformers 5.24: the reference test/test_cosmos3_diffusers.py compares with
"""
import xml.etree.ElementTree as ET
from pathlib import Path

from setuptools import find_packages, setup

HERE = Path(__file__).resolve().parent


def package_version() -> str:
    """The version of package.xml, the one place it is written."""
    return ET.parse(HERE / "package.xml").getroot().findtext("version").strip()


setup(
    name="phyai_ros",
    version=package_version(),
    description="Onboard real-time execution of physical-AI robot policies (pi0.5, pi0, GR00T N1.7): core without ROS",
    license="Apache-2.0",
    python_requires=">=3.10",
    # kernels/candidates/ (kernels no shipped profile picks, kept for other devices' profiles) rides along as
    # phyai_ros.kernels.candidates (package_dir maps it under kernels/).
    packages=find_packages(include=["phyai_ros", "phyai_ros.*"]) + ["phyai_ros.kernels", "phyai_ros.kernels.candidates",
                                                                    "phyai_ros.profiles", "phyai_ros.share.msg",
                                                                    "phyai_ros.share.config"],
    package_dir={"phyai_ros.kernels": "kernels", "phyai_ros.profiles": "profiles", "phyai_ros.share.msg": "msg",
                 "phyai_ros.share.config": "config"},
    # Data only: the shipped operator profiles (found by device name: phyai_ros.layers.profiles), the message
    # definitions and the parameter files (found by phyai_ros.share_dirs).
    package_data={"phyai_ros.profiles": ["*.json"], "phyai_ros.share.msg": ["*.msg"],
                  "phyai_ros.share.config": ["*.yaml", "*.xml"]},
    install_requires=["numpy>=2.2,<2.3", "torch==2.13.0", "safetensors>=0.8", "sentencepiece>=0.2.3", "pyyaml>=6",
                      "jinja2>=3.1"],
    extras_require={
        "ros": [],
        "bags": ["rosbags>=0.11.9,<0.12", "matplotlib>=3.11", "opencv-python-headless>=4.14,<5"],
        "gpu": ["triton==3.6.0"],
        # The versions seen working on the H200 (torch 2.11 + cu130); the backend reads one wrapper internal
        # (phyai_ros/layers/flashinfer_backend.py) and checks it when planning.
        "flashinfer": ["flashinfer-python==0.6.3", "apache-tvm-ffi==0.1.15.post2", "nvidia-cudnn-frontend==1.32.0"],
        "dev": ["pytest>=9", "ruff==0.17.5", "import-linter==2.17"],
        "serve": ["ray[serve]==2.60.0"],
        # Test extra: diffusers' own Cosmos3 pipeline as the reference of test/test_cosmos3_diffusers.py (the
        # versions the shared Cosmos3 fixtures were made with); pillow also snaps camera images to 16 px.
        "cosmos3-reference": ["diffusers==0.42.1", "transformers==5.24.0", "tokenizers==0.23.3",
                              "huggingface_hub==2.4.0", "pillow"],
    },
    entry_points={"console_scripts": [
        "phyai-predict = phyai_ros.predict:main",
        "phyai-replay = phyai_ros.replay.cli:main",
        "phyai-report = phyai_ros.replay.report:main",
        "phyai-demo-bag = phyai_ros.replay.demo_bag:main",
    ]},
)
