"""Adapter pieces shared by the pi-family policies (pi0.5, pi0): the adapter base (policy.py), their sizes
(pi_config.py), normalization, tokenization, image preprocessing and checkpoint I/O / key layouts. The
stateless network modules they run are in phyai_ros/modeling/."""
