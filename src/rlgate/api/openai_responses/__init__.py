"""rlgate.api.openai_responses."""
