"""rlgate.rollout."""
