"""rlgate.demo."""
