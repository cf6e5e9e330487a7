"""The node's parameters on ROS: every entry of the table (phyai_ros/parameters.py) declared with its type,
range, choices and description, read-only (the node reads them once at start: they size buffers, pick the model,
name topics, configure the loop, so a change at run time is refused instead of being silently ignored).
"""
from __future__ import annotations


from phyai_ros import needs_ros
from phyai_ros.parameters import SPECS, ParameterError, Parameters, Spec, unknown_names_error

with needs_ros(__name__):
    from rcl_interfaces.msg import FloatingPointRange, IntegerRange, ParameterDescriptor
    from rclpy.exceptions import InvalidParameterTypeException


def descriptor(name: str, spec: Spec) -> ParameterDescriptor:
    """Every parameter is read-only: the node reads them once at start (they size buffers, pick the
    model, name topics, configure the loop), so a change at run time is refused instead of being
    silently ignored."""
    text = spec.description + (f" (one of: {', '.join(spec.choices)})" if spec.choices else "")
    desc = ParameterDescriptor(description=text, read_only=True)
    if spec.range is not None and not isinstance(spec.default, bool):
        lo, hi = spec.range
        if isinstance(spec.default, int):
            desc.integer_range = [IntegerRange(from_value=int(lo), to_value=int(hi), step=0)]
        else:
            desc.floating_point_range = [FloatingPointRange(from_value=float(lo), to_value=float(hi), step=0.0)]
    return desc


_YAML_BOOLS = {"off", "on", "yes", "no", "y", "n", "true", "false"}


# Overrides ROS itself may consume on any node (QoS overrides of publishers/subscriptions).
_ROS_PREFIXES = ("qos_overrides.",)


def unknown_overrides(node) -> list[str]:
    """Names given to this node (params file for its name or /**, -p) that neither this table nor ROS
    (use_sim_time, ... already declared on the node) declares: a typo there would silently keep the default."""
    given = getattr(node, "_parameter_overrides", {})  # rclpy keeps rcl's overrides here (no public accessor)
    return sorted(name for name in given if name not in SPECS and not node.has_parameter(name)
                  and not name.startswith(_ROS_PREFIXES))


def check_no_unknown(node) -> None:
    """Refuse unknown parameter names, each with the closest declared name as a hint."""
    unknown = unknown_overrides(node)
    if unknown:
        raise unknown_names_error(unknown)


def declare_and_read(node) -> Parameters:
    """Declare every parameter on an rclpy node and return their values, checked (phyai_ros.parameters)."""
    check_no_unknown(node)
    values = {}
    for name, spec in SPECS.items():
        try:
            node.declare_parameter(name, spec.default, descriptor(name, spec))
        except InvalidParameterTypeException as exc:
            hint = ""
            if isinstance(spec.default, float):
                hint = " (a float parameter: write 1.0, not 1)"
            if isinstance(spec.default, str) and any(c.lower() in _YAML_BOOLS for c in spec.choices):
                hint = (" (YAML reads off/on/yes/no as booleans: quote the value, e.g. "
                        f"{name.split('.')[-1]}: 'off' in a params file or -p \"{name}:='off'\")")
            raise ParameterError(f"{exc}{hint}") from None
        values[name] = node.get_parameter(name).value
    return Parameters.of(values)
