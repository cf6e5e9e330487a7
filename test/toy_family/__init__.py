"""A toy flow-policy family that lives outside the package: the proof that a family is one folder and one
registry entry (``PHYAI_ROS_FAMILIES="toy_flow=toy_family.adapter:ToyFlowAdapter"``), with no shared file
changed. test/test_toy_family.py runs it through predict, the quantizer, the serve engine, the node over DDS and
a replay."""
