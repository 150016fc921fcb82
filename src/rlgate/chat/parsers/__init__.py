"""rlgate.chat.parsers."""
