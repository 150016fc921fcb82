"""rlgate.store."""
