"""The rclpy shell around the ROS-free control loop (topics, QoS, parameters, diagnostics)."""
