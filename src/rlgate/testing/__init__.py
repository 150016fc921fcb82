"""rlgate.testing."""
