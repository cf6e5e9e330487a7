"""The node's parameters: declared with type, range and description; both YAML files load through
rcl's own parser into valid values; bad values are refused; a node that cannot start says why."""
import pytest

from node_harness import CPU_CONFIG, THOR_CONFIG, NodeProcess, load_params, make_small_checkpoint, require_tokenizer
from phyai_ros.parameters import SPECS, ParameterError, Parameters


def declare_and_read(node):
    """The node's declaration (phyai_ros.node.parameters needs ROS: imported by the tests that start rclpy)."""
    from phyai_ros.node.parameters import declare_and_read as declare
    return declare(node)


@pytest.fixture
def ros_context():
    import rclpy
    context = rclpy.Context()
    rclpy.init(context=context)
    yield context
    rclpy.try_shutdown(context=context)


def make_node(context, *cli):
    import rclpy
    return rclpy.create_node("phyai_policy", context=context, cli_args=["--ros-args", *cli])


# ControlConfig fields the node sets from something other than a loop default: the policy's shape and
# cameras, the state's own age parameter (None in the loop means "the cameras' age"), start-up choices.
NOT_LOOP_DEFAULTS = {"action_dim", "cameras", "optional_cameras", "state_dim", "state_joint_names", "max_state_age",
                     "image_input_size", "require_instruction", "cold_start_inferences", "model_id"}


def test_parameter_defaults_are_the_control_loops_defaults():
    """A node started with the declared defaults runs the loop's defaults: one source, no drift
    (margin.window was 500 here and 200 in ControlConfig)."""
    import dataclasses

    from phyai_ros.control import ControlConfig
    # control.horizon defaults to 0, "the checkpoint's": the node resolves it (resolved_parameters) first.
    cfg = Parameters.of({"control.horizon": 50}).control_config()
    differ = {f.name: (getattr(cfg, f.name), f.default) for f in dataclasses.fields(ControlConfig)
              if f.default is not dataclasses.MISSING and f.name not in NOT_LOOP_DEFAULTS
              and getattr(cfg, f.name) != f.default}
    assert not differ, f"parameter defaults (left) differ from ControlConfig's (right): {differ}"


def _field_type(name: str):
    """The annotation of a dotted parameter's field, as a reader or a type checker sees it."""
    import typing
    section, _, field = name.rpartition(".")
    holder = typing.get_type_hints(Parameters)[section] if section else Parameters
    return typing.get_type_hints(holder)[field]


def test_every_parameter_field_is_typed_as_its_spec():
    """Each parameter's field carries its value's type (not Any): the type of its Spec's default, a tuple of the
    element type for a list; the values Parameters.of makes are of that type, and a range is only on numbers."""
    from typing import Tuple
    scalar = {bool: bool, int: int, float: float, str: str}
    p = Parameters.of({"control.dt": 1, "control.horizon": 50})   # an int where a float belongs is taken as one
    values = p.values()
    for name, spec in SPECS.items():
        kind = type(spec.default)
        expected = Tuple[type(spec.default[0]), ...] if kind is list else scalar[kind]
        assert _field_type(name) == expected, name
        value = values[name]
        assert type(value) is (list if kind is list else kind), (name, value)
        if spec.range is not None:
            assert kind in (int, float), name
    assert type(p.control.dt) is float and p.control.dt == 1.0


def test_a_field_typed_unlike_its_default_cannot_be_declared():
    """The table is read off the fields at import: one whose annotation disagrees with its default is refused."""
    import dataclasses

    from phyai_ros.parameters import _table, param

    @dataclasses.dataclass(frozen=True)
    class Section:
        dt: float = param(1, "an int default on a float field")

    @dataclasses.dataclass(frozen=True)
    class Root:
        section: Section
    with pytest.raises(TypeError, match="parameter section.dt: its field is typed <class 'float'>"):
        _table(Root)


def test_every_parameter_is_declared_typed_ranged_documented_and_read_only(ros_context):
    from rcl_interfaces.msg import ParameterType
    node = make_node(ros_context)
    values = declare_and_read(node).values()
    assert set(values) == set(SPECS)
    expected_type = {bool: ParameterType.PARAMETER_BOOL, int: ParameterType.PARAMETER_INTEGER,
                     float: ParameterType.PARAMETER_DOUBLE, str: ParameterType.PARAMETER_STRING}
    list_type = {bool: ParameterType.PARAMETER_BOOL_ARRAY, str: ParameterType.PARAMETER_STRING_ARRAY}
    for name, desc in zip(SPECS, node.describe_parameters(list(SPECS))):
        spec = SPECS[name]
        assert desc.name == name and desc.read_only and len(desc.description) > 15, name
        if isinstance(spec.default, list):
            assert desc.type == list_type[type(spec.default[0])], name
        else:
            assert desc.type == expected_type[type(spec.default)], name
        if spec.range is not None:
            ranges = desc.integer_range if isinstance(spec.default, int) else desc.floating_point_range
            assert (ranges[0].from_value, ranges[0].to_value) == spec.range, name
        if spec.choices:
            assert all(c in desc.description for c in spec.choices), name
    # Read-only: a change at run time is refused, not silently ignored.
    from rclpy.parameter import Parameter
    result = node.set_parameters([Parameter("margin.eps", value=0.2)])[0]
    assert not result.successful
    node.destroy_node()


@pytest.mark.parametrize("params_file", [CPU_CONFIG, THOR_CONFIG, THOR_CONFIG.parent / "pi0_thor.yaml",
                                         THOR_CONFIG.parent / "groot_thor.yaml",
                                         THOR_CONFIG.parent / "groot_cpu_test.yaml"],
                         ids=["cpu", "thor", "pi0_thor", "groot_thor", "groot_cpu"])
def test_yaml_files_load_through_rcl_into_valid_values(ros_context, params_file):
    in_file = load_params(params_file)
    assert set(in_file) <= set(SPECS), set(in_file) - set(SPECS)
    node = make_node(ros_context, "--params-file", str(params_file))
    values = declare_and_read(node).values()  # declares with rcl's parsed overrides, then validates
    for name, value in in_file.items():
        assert values[name] == value, name
    missing = set(SPECS) - set(in_file)
    # Left out: the model files and the lifecycle start (from the launch file / command line), what the
    # checkpoint says, and the remote backend's settings (onboard by default).
    assert missing <= {"model.checkpoint", "model.tokenizer", "model.norm_stats", "model.type", "control.horizon",
                       "model.embodiment", "policy.backend", "policy.endpoint", "policy.timeout", "policy.token",
                       "lifecycle.autostart"}, missing
    node.destroy_node()


def test_thor_defaults():
    p = load_params(THOR_CONFIG)
    assert (p["model.device"], p["model.dtype"], p["model.cuda_graphs"]) == ("cuda", "bfloat16", True)
    assert p["control.dt"] == 0.02 and p["rtc.mode"] == "guided"
    assert "control.horizon" not in p and "model.type" not in p   # the checkpoint's chunk size and type
    assert len(p["cameras.slots"]) == 3 and all(p["cameras.required"])


def test_out_of_range_and_bad_choices_are_refused(ros_context):
    from rclpy.exceptions import InvalidParameterValueException
    with pytest.raises(InvalidParameterValueException):
        declare_and_read(make_node(ros_context, "--params-file", str(CPU_CONFIG), "-p", "control.dt:=5.0"))
    with pytest.raises(ParameterError, match="rtc.mode"):
        declare_and_read(make_node(ros_context, "--params-file", str(CPU_CONFIG), "-p", "rtc.mode:=sometimes"))
    # YAML 1.1 reads an unquoted `off` as false: the error says to quote it; quoted, it works.
    with pytest.raises(ParameterError, match="quote the value"):
        declare_and_read(make_node(ros_context, "--params-file", str(CPU_CONFIG), "-p", "rtc.mode:=off"))
    assert declare_and_read(make_node(ros_context, "--params-file", str(CPU_CONFIG),
                                      "-p", "rtc.mode:='off'")).rtc.mode == "off"
    with pytest.raises(ParameterError, match="cameras.topics has 2 entries for 3"):
        declare_and_read(make_node(ros_context, "--params-file", str(CPU_CONFIG), "-p", "cameras.topics:=[a, b]"))


@pytest.mark.ros
def test_a_node_that_cannot_start_says_why_and_exits_1(tmp_path):
    tokenizer = require_tokenizer()
    node = NodeProcess(tmp_path / "no_such_checkpoint", tokenizer)
    assert node.wait_exit(timeout=60) == 1, node.stop()
    assert "cannot start: FileNotFoundError: model.checkpoint: no checkpoint folder" in node.stop()

    ckpt = make_small_checkpoint(tmp_path / "pi05_small", state_dim=6)
    node = NodeProcess(ckpt, tokenizer)
    assert node.wait_exit(timeout=60) == 1, node.stop()
    out = node.stop()
    assert "state.joint_names has 8 names; the policy's state has 6 dims" in out and "Traceback" not in out

    missing = tmp_path / "no_profile.json"
    node = NodeProcess(make_small_checkpoint(tmp_path / "pi05_ok"), tokenizer, overrides={"model.op_profile": str(missing)})
    assert node.wait_exit(timeout=60) == 1, node.stop()
    assert "cannot start: FileNotFoundError" in node.stop()


def write_params_with_typos(path):
    """The CPU config plus misspelt keys in this node's section and in /**, a key of another node (not
    ours to judge) and ROS's own use_sim_time (allowed)."""
    import yaml
    raw = yaml.safe_load(CPU_CONFIG.read_text())
    raw["phyai_policy"]["ros__parameters"]["rtc"]["max_guidence"] = 5.0
    raw["/**"] = {"ros__parameters": {"margin": {"epss": 0.1}, "use_sim_time": False}}
    raw["other_node"] = {"ros__parameters": {"anything": 1}}
    path.write_text(yaml.safe_dump(raw))
    return path


@pytest.mark.ros
def test_unknown_parameter_names_refuse_to_start_naming_them(tmp_path):
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path / "pi05_ok")
    node = NodeProcess(ckpt, tokenizer, overrides={"contrl.dt": 0.1})
    assert node.wait_exit(timeout=60) == 1, node.stop()
    out = node.stop()
    assert "cannot start: ParameterError: unknown parameter contrl.dt (did you mean control.dt?)" in out, out

    node = NodeProcess(ckpt, tokenizer, params_file=write_params_with_typos(tmp_path / "typos.yaml"))
    assert node.wait_exit(timeout=60) == 1, node.stop()
    out = node.stop()
    assert ("unknown parameters margin.epss (did you mean margin.eps?), rtc.max_guidence (did you mean "
            "rtc.max_guidance?)") in out, out
    assert "anything" not in out and "use_sim_time" not in out and "Traceback" not in out


@pytest.mark.ros
def test_a_model_that_cannot_act_refuses_to_start(tmp_path):
    """A pi0 label on pi0.5 weights, and finite weights whose warm-up chunk is NaN (it used to log
    'ready' and then never publish a chunk)."""
    from test_checkpoint_errors import nan_action_stats
    tokenizer = require_tokenizer()
    ckpt = make_small_checkpoint(tmp_path / "pi05_ok")
    node = NodeProcess(nan_action_stats(ckpt, tmp_path), tokenizer)
    assert node.wait_exit(timeout=90) == 1, node.stop()
    out = node.stop()
    assert "cannot start: ValueError:" in out and "produces non-finite actions" in out, out
    assert " ready in " not in out and "Traceback" not in out

    node = NodeProcess(ckpt, tokenizer, overrides={"model.type": "pi0"})
    assert node.wait_exit(timeout=60) == 1, node.stop()
    out = node.stop()
    assert "config.json says type pi05 but model.type (the policy type asked for) is pi0" in out, out
