"""rlgate.trajectory."""
