"""Replay a recorded session through the policy node: `ros2 launch phyai_ros replay.launch.py bag:=DIR`.

    ros2 launch phyai_ros replay.launch.py bag:=/data/session_042 \
        params_file:=/etc/phyai/pi05_thor.yaml mode:=realtime rate:=1.0 \
        remaps:='/cam0/image_raw:=/cameras/base/image /joints:=/joint_states' report:=true

Starts the policy node with `use_sim_time` (unless start_node:=false: then a node you started
yourself, with use_sim_time:=true, is replayed into) and the `replay` tool, which owns /clock,
plays the bag, records the node's outputs into `out` and writes the report; the launch ends
with the replay.  Stepped (deterministic) mode needs one diagnostics report per control tick:
give `mode:=stepped diagnostics_period:=<control.dt>`.  Thin by design: the logic is in
`phyai_ros.replay` (`ros2 run phyai_ros replay --help`).
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, EmitEvent, RegisterEventHandler
from launch.conditions import IfCondition
from launch.event_handlers import OnProcessExit
from launch.events import Shutdown
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution, PythonExpression
from launch_ros.actions import Node
from launch_ros.substitutions import FindPackageShare

ARGUMENTS = {  # name -> (default, description)
    "bag": (None, "rosbag2 folder to replay (sqlite3 or mcap)"),
    "params_file": (PathJoinSubstitution([FindPackageShare("phyai_ros"), "config", "pi05_thor.yaml"]),
                    "the policy node's parameters"),
    "mode": ("realtime", "realtime (recorded timing, scaled by rate) or stepped (deterministic)"),
    "rate": ("1.0", "real-time speed factor"),
    "out": ("", "output bag folder (default: <bag>_replay_<time>)"),
    "remaps": ("", "bag topic remaps, 'FROM:=TO FROM:=TO'"),
    "start_node": ("true", "start the policy node here (false: replay into a running one)"),
    "diagnostics_period": ("0.05", "stepped mode: the node's diagnostics.period, equal to its control.dt"),
    "report": ("true", "write the HTML/Markdown report next to the output bag"),
}


def generate_launch_description():
    cfg = {name: LaunchConfiguration(name) for name in ARGUMENTS}
    declared = [DeclareLaunchArgument(name, description=desc, **({} if default is None else
                                                                 {"default_value": default}))
                for name, (default, desc) in ARGUMENTS.items()]
    start = cfg["start_node"]

    def policy_node(extra: dict, condition) -> Node:
        return Node(package="phyai_ros", executable="onboard_node", name="phyai_policy", output="screen",
                    parameters=[cfg["params_file"], {"use_sim_time": True, **extra}], condition=condition)

    node_realtime = policy_node({}, IfCondition(PythonExpression([
        "'", start, "'.lower() == 'true' and '", cfg["mode"], "' != 'stepped'"])))
    node_stepped = policy_node({"diagnostics.period": cfg["diagnostics_period"]}, IfCondition(PythonExpression([
        "'", start, "'.lower() == 'true' and '", cfg["mode"], "' == 'stepped'"])))
    replay = Node(package="phyai_ros", executable="replay", name="phyai_replay", output="screen",
                  arguments=[cfg["bag"], "--mode", cfg["mode"], "--rate", cfg["rate"], "--out", cfg["out"],
                             "--remap", cfg["remaps"], "--report", cfg["report"],
                             "--params-file", cfg["params_file"]])
    stop_with_replay = RegisterEventHandler(OnProcessExit(
        target_action=replay, on_exit=[EmitEvent(event=Shutdown(reason="replay finished"))]))
    return LaunchDescription([*declared, node_realtime, node_stepped, replay, stop_with_replay])
