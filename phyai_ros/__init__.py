"""phyai_ros: real-time onboard execution of physical-AI robot policies under ROS 2.

The generated message types (``phyai_ros.msg``) are installed by rosidl into the
environment's site-packages, while this source tree may sit elsewhere on
``sys.path`` (a checkout used in place).  ``extend_path`` lets both halves of the
package be found under one name; on an installed system they share one folder
and this is a no-op.
"""
from pkgutil import extend_path

__path__ = extend_path(__path__, __name__)
