"""Start the GR00T N1.7 policy node on the robot: `ros2 launch phyai_ros groot_thor.launch.py`.

The node, its arguments and topic remappings are pi05_thor.launch.py's (included, so the launch files cannot
drift apart); this file only points them at GR00T's tuning (config/groot_thor.yaml) and model folder. GR00T
reads its tokenizer and statistics from the checkpoint's own folders, so `tokenizer` defaults to empty (a file
given is refused at start). Every argument of pi05_thor.launch.py works here too, e.g.
`ros2 launch phyai_ros groot_thor.launch.py checkpoint:=/data/groot_so101/checkpoint base_camera:=/cam0/image_raw`.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

SHARE = FindPackageShare("phyai_ros")
# launch argument -> GR00T's default (the included file declares the rest)
DEFAULTS = {
    "params_file": PathJoinSubstitution([SHARE, "config", "groot_thor.yaml"]),
    "checkpoint": "/opt/phyai/models/groot_n17/checkpoint",
    "tokenizer": "",
}


def generate_launch_description():
    declared = [DeclareLaunchArgument(name, default_value=default,
                                      description="GR00T N1.7 default; see pi05_thor.launch.py")
                for name, default in DEFAULTS.items()]
    node = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([SHARE, "launch", "pi05_thor.launch.py"])),
        launch_arguments={name: LaunchConfiguration(name) for name in DEFAULTS}.items())
    return LaunchDescription([*declared, node])
