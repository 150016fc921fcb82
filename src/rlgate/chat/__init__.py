"""rlgate.chat."""
