"""rlgate.api.anthropic."""
