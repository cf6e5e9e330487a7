"""``python -m phyai_ros.replay`` = the ``replay`` command."""
import sys

from phyai_ros.replay.cli import main

sys.exit(main())
