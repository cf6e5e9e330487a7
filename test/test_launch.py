"""launch/pi05_thor.launch.py and launch/pi0_thor.launch.py: a STRUCTURE CHECK, not a run of `ros2 launch`.

`launch` / `launch_ros` are not installable here (see shared/research/ros2-from-pypi.md), so the
launch file is imported against a minimal stand-in of the launch API (the classes it uses, with
the keyword arguments the real ones accept; anything else fails) and `generate_launch_description()`
is evaluated by resolving its substitutions the way launch would. What this proves: the node's
package/executable/name, that the params file resolves to config/pi05_thor.yaml, that every
remapped topic is one the node uses per that YAML, that every parameter override names a declared
parameter, and that arguments reach the node. The last test goes one step further and runs the
node with the equivalent command line (`--params-file`, `-p`, `-r`), checking in the ROS graph that
the remappings took effect and that chunks flow on the robot's topics; for pi0_thor.launch.py (which
includes the pi0.5 file with pi0's YAML and model folder) the same run shows the node serving pi0, and for
groot_thor.launch.py (the same include with GR00T's YAML, no tokenizer) a small GR00T N1.7. Not covered: launch's own
substitution/process machinery and `FindPackageShare` on an install, which need a ROS install.
"""
import importlib.util
import sys
import types
from pathlib import Path

import pytest
import yaml

from node_harness import (NODE_NAME, REPO, THOR_CONFIG, FakeRobot, NodeProcess, load_params, make_small_checkpoint,
                          param_arg, remapped, require_tokenizer)
from phyai_ros import fixtures
from fixture_sets import minicpm_fixture_dir, require_groot_fixture
from phyai_ros.parameters import SPECS

LAUNCH_FILE = REPO / "launch" / "pi05_thor.launch.py"
PI0_LAUNCH_FILE = REPO / "launch" / "pi0_thor.launch.py"
PI0_CONFIG = REPO / "config" / "pi0_thor.yaml"
GROOT_LAUNCH_FILE = REPO / "launch" / "groot_thor.launch.py"
GROOT_CONFIG = REPO / "config" / "groot_thor.yaml"
MINICPM_LAUNCH_FILE = REPO / "launch" / "minicpm_thor.launch.py"
MINICPM_CONFIG = REPO / "config" / "minicpm_thor.yaml"
# neither YAML nor launch file needs to restate these (empty: the checkpoint's)
FROM_CHECKPOINT = {"model.type", "control.horizon", "model.embodiment"}


# ----------------------------------------------------------------------------- the stand-in
class Recorded:
    """Base of the stand-in classes: keeps its arguments; refuses keywords the real class lacks."""
    accepts: tuple = ()

    def __init__(self, *args, **kwargs):
        unknown = set(kwargs) - set(self.accepts)
        if unknown:
            raise TypeError(f"{type(self).__name__}() got unexpected keyword(s) {sorted(unknown)}")
        self.args, self.kwargs = args, kwargs


class LaunchDescription(Recorded):
    accepts = ("initial_entities", "deprecated_reason")

    @property
    def entities(self):
        return list(self.args[0] if self.args else self.kwargs.get("initial_entities", []))


class DeclareLaunchArgument(Recorded):
    accepts = ("default_value", "description", "choices")

    @property
    def name(self):
        return self.args[0]


class LaunchConfiguration(Recorded):
    accepts = ("default",)


class PathJoinSubstitution(Recorded):
    accepts = ()


class FindPackageShare(Recorded):
    accepts = ()


class ParameterValue(Recorded):
    accepts = ("value_type",)


class IncludeLaunchDescription(Recorded):
    accepts = ("launch_arguments",)


class PythonLaunchDescriptionSource(Recorded):
    accepts = ()


class Node(Recorded):
    accepts = ("executable", "package", "name", "namespace", "exec_name", "parameters", "remappings",
               "ros_arguments", "arguments", "output", "respawn", "respawn_delay", "emulate_tty", "prefix",
               "additional_env", "on_exit", "sigterm_timeout", "sigkill_timeout")


def stand_in_modules():
    def module(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        return m
    return {
        "launch": module("launch", LaunchDescription=LaunchDescription),
        "launch.actions": module("launch.actions", DeclareLaunchArgument=DeclareLaunchArgument,
                                 IncludeLaunchDescription=IncludeLaunchDescription),
        "launch.launch_description_sources": module("launch.launch_description_sources",
                                                    PythonLaunchDescriptionSource=PythonLaunchDescriptionSource),
        "launch.substitutions": module("launch.substitutions", LaunchConfiguration=LaunchConfiguration,
                                       PathJoinSubstitution=PathJoinSubstitution),
        "launch_ros": module("launch_ros"),
        "launch_ros.actions": module("launch_ros.actions", Node=Node),
        "launch_ros.substitutions": module("launch_ros.substitutions", FindPackageShare=FindPackageShare),
        "launch_ros.parameter_descriptions": module("launch_ros.parameter_descriptions",
                                                    ParameterValue=ParameterValue),
    }


class Evaluated:
    """The launch description with its substitutions resolved for given launch arguments.
    FindPackageShare('phyai_ros') resolves to the repository root, which holds what CMake installs
    into share/phyai_ros (launch/ and config/)."""

    def __init__(self, description, arguments=None):
        entities = description.entities
        self.declared = {e.name: e for e in entities if isinstance(e, DeclareLaunchArgument)}
        nodes = [e for e in entities if isinstance(e, Node)]
        assert len(nodes) == 1 and len(entities) == len(self.declared) + 1, "one node plus its arguments"
        self.node = nodes[0].kwargs
        self.used = set()
        self.values = {}
        for name, arg in self.declared.items():
            given = (arguments or {}).get(name)
            self.values[name] = given if given is not None else self.resolve(arg.kwargs["default_value"])

    def resolve(self, value):
        if isinstance(value, str):
            return value
        if isinstance(value, LaunchConfiguration):
            name = value.args[0]
            assert name in self.declared, f"LaunchConfiguration({name!r}) names no declared argument"
            self.used.add(name)
            return self.values[name]
        if isinstance(value, PathJoinSubstitution):
            return str(Path(*[self.resolve(v) for v in value.args[0]]))
        if isinstance(value, FindPackageShare):
            assert value.args == ("phyai_ros",)
            return str(REPO)
        if isinstance(value, ParameterValue):
            resolved = self.resolve(value.args[0])
            return value.kwargs.get("value_type", str)(resolved)
        raise TypeError(f"no stand-in for {type(value).__name__}")

    def params_files(self):
        return [self.resolve(p) for p in self.node["parameters"] if not isinstance(p, dict)]

    def overrides(self):
        out = {}
        for p in self.node["parameters"]:
            if isinstance(p, dict):
                out.update({k: self.resolve(v) for k, v in p.items()})
        return out

    def remappings(self):
        return {self.resolve(src): self.resolve(dst) for src, dst in self.node["remappings"]}

    def command_line(self):
        """The `--ros-args` a launch of this description gives the node."""
        args = []
        for f in self.params_files():
            args += ["--params-file", f]
        for k, v in self.overrides().items():
            args += ["-p", param_arg(k, v)]
        for src, dst in self.remappings().items():
            args += ["-r", f"{src}:={dst}"]
        return args


def load_launch_file(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem.replace(".", "_"), path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def stand_ins(monkeypatch):
    for name, module in stand_in_modules().items():
        monkeypatch.setitem(sys.modules, name, module)


@pytest.fixture
def launch_module(stand_ins):
    return load_launch_file(LAUNCH_FILE)


def evaluate_pi0(arguments=None, launch_file: Path = PI0_LAUNCH_FILE) -> Evaluated:
    """pi0_thor.launch.py (or another file that includes the pi0.5 one: groot_thor.launch.py) as launch runs
    it: its own arguments resolved, then the included file evaluated with them (launch configurations given
    on the command line reach included files too)."""
    arguments = dict(arguments or {})
    entities = load_launch_file(launch_file).generate_launch_description().entities
    includes = [e for e in entities if isinstance(e, IncludeLaunchDescription)]
    declared = {e.name: e for e in entities if isinstance(e, DeclareLaunchArgument)}
    assert len(includes) == 1 and len(entities) == len(declared) + 1, "one include plus its arguments"
    own = {n: arguments.get(n, d.kwargs["default_value"]) for n, d in declared.items()}
    resolver = Evaluated.__new__(Evaluated)
    resolver.declared, resolver.values, resolver.used = declared, {}, set()
    resolver.values = {n: resolver.resolve(v) for n, v in own.items()}
    source, = includes[0].args
    included = Path(resolver.resolve(source.args[0]))
    passed = {resolver.resolve(k): resolver.resolve(v) for k, v in includes[0].kwargs["launch_arguments"]}
    assert resolver.used == set(declared), f"every argument of {launch_file.name} reaches the included launch file"
    ev = Evaluated(load_launch_file(included).generate_launch_description(), {**arguments, **passed})
    ev.included = included
    return ev


def node_topics(params):
    """Every topic name the node subscribes or publishes with these parameters (besides /diagnostics)."""
    topics = set(params["cameras.topics"]) | {params["state.topic"], params["instruction.topic"]}
    topics |= {params[k] for k in ("output.command_topic", "output.chunk_topic", "output.chunk_trajectory_topic",
                                   "output.margin_topic") if params[k]}
    return topics


# ----------------------------------------------------------------------------- structure checks
def test_structure_node_and_params_file(launch_module):
    ev = Evaluated(launch_module.generate_launch_description())
    node = ev.node
    assert (node["package"], node["executable"], node["name"]) == ("phyai_ros", "onboard_node", NODE_NAME)
    # The executable exists and is installed under that name.
    assert (REPO / "bin" / "onboard_node").is_file()
    assert "bin/onboard_node" in (REPO / "CMakeLists.txt").read_text()
    assert ev.params_files() == [str(THOR_CONFIG)]
    assert list(yaml.safe_load(THOR_CONFIG.read_text())) == [NODE_NAME], "YAML keyed by the launched node's name"


def test_structure_remaps_only_topics_the_node_uses_and_all_its_inputs(launch_module):
    ev = Evaluated(launch_module.generate_launch_description())
    params = load_params(THOR_CONFIG)
    used = node_topics(params)
    remaps = ev.remappings()
    assert set(remaps) <= used, f"remaps of topics the node does not use: {set(remaps) - used}"
    inputs = set(params["cameras.topics"]) | {params["state.topic"], params["instruction.topic"]}
    assert inputs <= set(remaps), f"inputs the robot cannot connect: {inputs - set(remaps)}"
    assert all(dst.startswith("/") for dst in remaps.values())


def test_structure_parameter_overrides_name_declared_parameters(launch_module):
    ev = Evaluated(launch_module.generate_launch_description())
    overrides = ev.overrides()
    assert set(overrides) <= set(SPECS), set(overrides) - set(SPECS)
    # They are exactly the ones the Thor YAML leaves to the launch file (not what the checkpoint says), and are
    # strings.
    assert set(overrides) == set(SPECS) - set(load_params(THOR_CONFIG)) - FROM_CHECKPOINT
    assert all(isinstance(v, str) for v in overrides.values())
    # Every declared argument reaches the node (nothing declared and then ignored).
    ev.command_line()
    assert ev.used == set(ev.declared), set(ev.declared) - ev.used


def test_structure_arguments_override_checkpoint_and_topics(launch_module):
    ev = Evaluated(launch_module.generate_launch_description(),
                   {"checkpoint": "/data/pi05_towels", "base_camera": "/cam0/image_raw", "command": "/arm/cmd",
                    "params_file": "/etc/phyai/my.yaml"})
    assert ev.overrides()["model.checkpoint"] == "/data/pi05_towels"
    assert ev.remappings()["cameras/base/image"] == "/cam0/image_raw"
    assert ev.remappings()["command"] == "/arm/cmd"
    assert ev.params_files() == ["/etc/phyai/my.yaml"]


def test_pi0_launch_is_the_pi05_node_with_pi0_config_and_model(stand_ins):
    ev = evaluate_pi0()
    assert ev.included == LAUNCH_FILE
    assert (ev.node["package"], ev.node["executable"], ev.node["name"]) == ("phyai_ros", "onboard_node", NODE_NAME)
    assert ev.params_files() == [str(PI0_CONFIG)]
    assert load_params(PI0_CONFIG)["model.id"] == "pi0"
    # The policy type and chunk size are the checkpoint's, never restated by hand in a config file.
    for config in (PI0_CONFIG, THOR_CONFIG):
        assert not {"model.type", "control.horizon"} & set(load_params(config)), config
    assert list(yaml.safe_load(PI0_CONFIG.read_text())) == [NODE_NAME]
    assert ev.overrides()["model.checkpoint"] == "/opt/phyai/models/pi0"
    assert set(ev.overrides()) == set(SPECS) - set(load_params(PI0_CONFIG)) - FROM_CHECKPOINT


def test_pi0_launch_passes_the_robots_arguments_through(stand_ins):
    ev = evaluate_pi0({"checkpoint": "/data/pi0_towels", "base_camera": "/cam0/image_raw",
                       "params_file": "/etc/phyai/pi0.yaml"})
    assert ev.overrides()["model.checkpoint"] == "/data/pi0_towels"
    assert ev.remappings()["cameras/base/image"] == "/cam0/image_raw"
    assert ev.params_files() == ["/etc/phyai/pi0.yaml"]


def test_groot_launch_is_the_pi05_node_with_groot_config_and_no_tokenizer(stand_ins):
    ev = evaluate_pi0(launch_file=GROOT_LAUNCH_FILE)
    assert ev.included == LAUNCH_FILE
    assert (ev.node["package"], ev.node["executable"], ev.node["name"]) == ("phyai_ros", "onboard_node", NODE_NAME)
    assert ev.params_files() == [str(GROOT_CONFIG)]
    params = load_params(GROOT_CONFIG)
    assert (params["model.id"], params["rtc.mode"], params["model.device"]) == ("groot_n17", "native", "cuda")
    assert all(params["cameras.required"]), "GR00T masks no camera slot"
    assert not {"model.type", "control.horizon"} & set(params)
    assert list(yaml.safe_load(GROOT_CONFIG.read_text())) == [NODE_NAME]
    overrides = ev.overrides()
    assert overrides["model.checkpoint"] == "/opt/phyai/models/groot_n17/checkpoint"
    assert overrides["model.tokenizer"] == "" and overrides["model.norm_stats"] == ""   # the checkpoint's own
    assert set(overrides) == set(SPECS) - set(params) - FROM_CHECKPOINT
    remaps, used = ev.remappings(), node_topics(params)
    assert set(remaps) <= used, set(remaps) - used
    assert set(params["cameras.topics"]) | {params["state.topic"], params["instruction.topic"]} <= set(remaps)
    ev = evaluate_pi0({"checkpoint": "/data/groot/checkpoint", "base_camera": "/cam0/image_raw"}, GROOT_LAUNCH_FILE)
    assert ev.overrides()["model.checkpoint"] == "/data/groot/checkpoint"
    assert ev.remappings()["cameras/base/image"] == "/cam0/image_raw"


def test_minicpm_launch_is_the_pi05_node_with_minicpm_config(stand_ins):
    ev = evaluate_pi0(launch_file=MINICPM_LAUNCH_FILE)
    assert ev.included == LAUNCH_FILE
    assert ev.params_files() == [str(MINICPM_CONFIG)]
    params = load_params(MINICPM_CONFIG)
    assert (params["model.id"], params["rtc.mode"], params["model.device"]) == ("minicpm_robot", "native", "cuda")
    assert (params["model.dtype"], params["model.cuda_graphs"], params["model.embodiment"]) == ("bfloat16", True, "0")
    assert "head_dtype=float32" in params["model.options"] and "prompt_template=" in params["model.options"]
    assert len(params["state.joint_names"]) == len(params["control.action_names"]) == 80   # the unified layout
    assert all(params["cameras.required"]) and len(params["cameras.slots"]) == 3
    assert not {"model.type", "control.horizon"} & set(params)
    overrides = ev.overrides()
    assert overrides["model.checkpoint"] == "/opt/phyai/models/minicpm_robot"
    assert overrides["model.tokenizer"] == "" and overrides["model.norm_stats"] == ""
    assert set(overrides) == set(SPECS) - set(params) - FROM_CHECKPOINT
    remaps, used = ev.remappings(), node_topics(params)
    assert set(remaps) <= used, set(remaps) - used


# ----------------------------------------------------------------------------- the equivalent command line
@pytest.mark.ros
@pytest.mark.parametrize("policy", ["pi05", "pi0", "groot", "minicpm"])
def test_equivalent_command_line_remaps_the_running_node(stand_ins, tmp_path, policy):
    """Run the node with the command line the launch file gives it (its Thor YAML, model-file
    parameters, remappings) plus CPU overrides for this machine (device, dtype, no warm-up): the
    remapped topics are in the ROS graph with the node on them, and it acts on them with that policy."""
    thor = load_params({"pi0": PI0_CONFIG, "groot": GROOT_CONFIG, "minicpm": MINICPM_CONFIG}.get(policy, THOR_CONFIG))
    dims = {"state_dim": len(thor["state.joint_names"]), "action_dim": len(thor["control.action_names"])}
    if policy == "groot":   # GR00T's tokenizer and statistics are its checkpoint's; cameras the Thor YAML's
        require_groot_fixture()
        horizon = 16
        ckpt = fixtures.make_small_checkpoint(tmp_path / "groot_small", policy="groot_n17", horizon=horizon,
                                              cameras=thor["cameras.slots"], **dims)
        arguments = {"checkpoint": str(ckpt)}
    elif policy == "minicpm":   # tokenizer and processor: the checkpoint's own; the 80-D layout of the Thor YAML
        if not (minicpm_fixture_dir() / "backbone_config.json").is_file():
            pytest.skip("MiniCPM-Robot parity set not found")
        horizon = 16
        ckpt = fixtures.make_small_checkpoint(tmp_path / "minicpm_small", policy="minicpm_robot", horizon=horizon,
                                              cameras=thor["cameras.slots"], **dims)
        arguments = {"checkpoint": str(ckpt)}
    else:
        tokenizer = require_tokenizer()
        horizon = 50   # the checkpoint's chunk size: the node takes H (and the type) from it
        ckpt = make_small_checkpoint(tmp_path / f"{policy}_small", horizon=horizon, policy=policy, **dims)
        arguments = {"checkpoint": str(ckpt), "tokenizer": str(tokenizer)}
    ev = Evaluated(load_launch_file(LAUNCH_FILE).generate_launch_description(), arguments) if policy == "pi05" \
        else evaluate_pi0(arguments, {"groot": GROOT_LAUNCH_FILE, "minicpm": MINICPM_LAUNCH_FILE}.get(policy,
                                                                                                 PI0_LAUNCH_FILE))
    cpu = {"model.device": "cpu", "model.dtype": "float32", "model.cuda_graphs": False, "model.warmup_runs": 0}
    cli = ev.command_line() + [a for k, v in cpu.items() for a in ("-p", param_arg(k, v))]
    remaps = ev.remappings()
    proc = NodeProcess.from_ros_args(cli, {**thor, **ev.overrides(), **cpu})
    robot = FakeRobot(remapped(proc.params, remaps), rate_hz=30.0)
    try:
        graph = robot.node

        def endpoints():
            on = {t for t in remaps.values()
                  if any(i.node_name == NODE_NAME for i in graph.get_subscriptions_info_by_topic(t))}
            out = {t for t in remaps.values()
                   if any(i.node_name == NODE_NAME for i in graph.get_publishers_info_by_topic(t))}
            return on, out

        inputs = {remaps[t] for t in thor["cameras.topics"] + [thor["state.topic"], thor["instruction.topic"]]}
        outputs = {remaps[t] for t in (thor["output.command_topic"], thor["output.chunk_topic"],
                                       thor["output.margin_topic"])}
        ok = robot.spin_until(lambda: endpoints() == (inputs, outputs), timeout=60)
        assert ok, f"{endpoints()} != {(inputs, outputs)}\n{proc.output()}"
        for topic in thor["cameras.topics"]:  # nothing is left on the node's own names
            assert not graph.get_subscriptions_info_by_topic("/" + topic)
        # And it acts on the robot's topics: chunks for the robot's cameras and instruction.
        robot.set_instruction("fold the towel")
        assert robot.spin_until(lambda: len(robot.chunks) >= 2, timeout=60), proc.output()
        assert robot.chunks[0].msg.horizon == horizon
        # The node loads the type the checkpoint names, so chunks from the pi0 checkpoint are pi0's.
        assert robot.chunks[0].msg.model_id == thor["model.id"]
    finally:
        robot.close()
        print(proc.stop())
