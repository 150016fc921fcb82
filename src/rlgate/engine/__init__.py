"""rlgate.engine."""
