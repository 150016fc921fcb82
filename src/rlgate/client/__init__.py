"""rlgate.client."""
