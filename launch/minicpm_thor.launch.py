"""Start the MiniCPM-Robot policy node on the robot: `ros2 launch phyai_ros minicpm_thor.launch.py`.

The node, its arguments and topic remappings are pi05_thor.launch.py's (included, so the launch files cannot
drift apart); this file only points them at MiniCPM-Robot's tuning (config/minicpm_thor.yaml: cameras, the 80-D
unified state / action layout, the embodiment bank, the prompt template) and model folder. MiniCPM-Robot reads its
tokenizer and processor from the checkpoint's processor/ folder, so `tokenizer` defaults to empty (a file given is
refused at start). Every argument of pi05_thor.launch.py works here too, e.g.
`ros2 launch phyai_ros minicpm_thor.launch.py checkpoint:=/data/minicpm_robot base_camera:=/cam0/image_raw`.
"""
from launch import LaunchDescription
from launch.actions import DeclareLaunchArgument, IncludeLaunchDescription
from launch.launch_description_sources import PythonLaunchDescriptionSource
from launch.substitutions import LaunchConfiguration, PathJoinSubstitution
from launch_ros.substitutions import FindPackageShare

SHARE = FindPackageShare("phyai_ros")
# launch argument -> MiniCPM-Robot's default (the included file declares the rest)
DEFAULTS = {
    "params_file": PathJoinSubstitution([SHARE, "config", "minicpm_thor.yaml"]),
    "checkpoint": "/opt/phyai/models/minicpm_robot",
    "tokenizer": "",
}


def generate_launch_description():
    declared = [DeclareLaunchArgument(name, default_value=default,
                                      description="MiniCPM-Robot default; see pi05_thor.launch.py")
                for name, default in DEFAULTS.items()]
    node = IncludeLaunchDescription(
        PythonLaunchDescriptionSource(PathJoinSubstitution([SHARE, "launch", "pi05_thor.launch.py"])),
        launch_arguments={name: LaunchConfiguration(name) for name in DEFAULTS}.items())
    return LaunchDescription([*declared, node])
