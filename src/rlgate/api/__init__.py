"""rlgate.api."""
