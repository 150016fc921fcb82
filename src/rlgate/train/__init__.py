"""rlgate.train."""
