"""OpenAI Responses API surface: ``POST /v1/responses`` (and ``/responses``).

``protocol`` holds the wire models, ``convert`` turns input items into rlgate's
conversation model, ``objects`` builds Response objects and output items, ``serving``
runs a generation as one Response or as streaming events (``ItemBuilder``), ``router``
wires auth, parsing and JSON vs SSE. See docs/openai-responses.md.
"""
