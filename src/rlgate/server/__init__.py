"""rlgate.server."""
