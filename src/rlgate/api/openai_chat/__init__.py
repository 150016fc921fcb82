"""rlgate.api.openai_chat."""
