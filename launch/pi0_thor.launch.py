"""Start the pi0 policy node on the robot: `ros2 launch phyai_ros pi0_thor.launch.py`.

The node, its arguments and topic remappings are pi05_thor.launch.py's (included, so the two cannot
drift apart); this file only points them at pi0's tuning (config/pi0_thor.yaml) and pi0's model folder
(the model type and chunk size come from the checkpoint). Every argument of pi05_thor.launch.py works
here too, e.g.
`ros2 launch phyai_ros pi0_thor.launch.py checkpoint:=/data/pi0_towels base_camera:=/cam0/image_raw`.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

SHARE = FindPackageShare("phyai_ros")
# launch argument -> pi0's default (the included file declares the rest)
DEFAULTS = {
    "params_file": PathJoinSubstitution([SHARE, "config", "pi0_thor.yaml"]),
    "checkpoint": "/opt/phyai/models/pi0",
    "tokenizer": "/opt/phyai/models/pi0/tokenizer.model",
}


def generate_launch_description():
    declared = [DeclareLaunchArgument(name, default_value=default, description="pi0 default; see pi05_thor.launch.py")
                for name, default in DEFAULTS.items()]
    node = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([SHARE, "launch", "pi05_thor.launch.py"])),
        launch_arguments={name: LaunchConfiguration(name) for name in DEFAULTS}.items())
    return LaunchDescription([*declared, node])
