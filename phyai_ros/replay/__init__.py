"""Rosbag replay testing: play a recorded session through the policy node and account for it.

* ``scan``: plan a replay (clock, roles, verdicts, events) from a bag and the node's parameters;
* ``player``: publish it into live topics and record outputs (``recording``) into the output bag (``outbag``),
  as ``options`` ask: in real time (``realtime``) or in deterministic steps (``stepped``), both on ``playback``;
  what a replay produced is ``result``;
* ``accounting``: what became of every input message (used / superseded / stale / rejected);
* ``report``: HTML/Markdown report with plots from an output bag (read back by ``runbag``): the numbers
  (``analysis``), the verdict (``verdict``), the plots (``figures``) and the text (``render``);
* ``demo_bag``: a synthetic session to try it all without a download;
* ``cli``: the ``replay`` command.  ``phyai_ros.testing`` wraps it for pytest.

Heavy imports (rclpy, matplotlib) happen in the submodules that need them.
"""
