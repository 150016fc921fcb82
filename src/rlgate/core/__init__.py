"""The serving core: sessions, limits, the generation service and request types; knows nothing of HTTP."""
