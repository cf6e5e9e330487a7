"""Start the pi0.5 policy node on the robot: `ros2 launch phyai_ros pi05_thor.launch.py`.

Thin by design: tuning lives in config/pi05_thor.yaml, logic in the package.
Arguments give the model files and remap the node's topics onto the robot's, e.g.
`ros2 launch phyai_ros pi05_thor.launch.py checkpoint:=/data/pi05_towels base_camera:=/cam0/image_raw`.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.actions import Node
from launch_ros.parameter_descriptions import ParameterValue
from launch_ros.substitutions import FindPackageShare

# launch argument -> (default, node parameter it sets)
PARAMETERS = {
    "checkpoint": ("/opt/phyai/models/pi05", "model.checkpoint"),
    "tokenizer": ("/opt/phyai/models/pi05/tokenizer.model", "model.tokenizer"),
    "norm_stats": ("", "model.norm_stats"),  # empty: the checkpoint folder's statistics
    # lifecycle state the node brings itself to: active (default), configured (loaded, waiting for `ros2 lifecycle
    # set /phyai_policy activate`) or unconfigured (a lifecycle manager drives it)
    "autostart": ("active", "lifecycle.autostart"),
}
# launch argument -> (default, node topic it remaps; the node's names are in the params file)
TOPICS = {
    "base_camera": ("/camera/base/image_raw", "cameras/base/image"),
    "left_wrist_camera": ("/camera/left_wrist/image_raw", "cameras/left_wrist/image"),
    "right_wrist_camera": ("/camera/right_wrist/image_raw", "cameras/right_wrist/image"),
    "joint_states": ("/joint_states", "joint_states"),
    "instruction": ("/instruction", "instruction"),
    "command": ("/policy/command", "command"),
    "action_chunk": ("/policy/action_chunk", "action_chunk"),
    "control_margin": ("/policy/control_margin", "control_margin"),
}


def generate_launch_description():
    declared = [DeclareLaunchArgument(name, default_value=default, description=f"sets parameter {target}")
                for name, (default, target) in PARAMETERS.items()]
    declared += [DeclareLaunchArgument(name, default_value=default, description=f"remaps topic {target}")
                 for name, (default, target) in TOPICS.items()]
    declared.append(DeclareLaunchArgument(
        "params_file", description="node parameters (YAML)",
        default_value=PathJoinSubstitution([FindPackageShare("phyai_ros"), "config", "pi05_thor.yaml"])))
    node = Node(
        package="phyai_ros",
        executable="onboard_node",
        name="phyai_policy",
        output="screen",
        parameters=[LaunchConfiguration("params_file"),
                    {target: ParameterValue(LaunchConfiguration(name), value_type=str)
                     for name, (_, target) in PARAMETERS.items()}],
        remappings=[(target, LaunchConfiguration(name)) for name, (_, target) in TOPICS.items()],
    )
    return LaunchDescription([*declared, node])
