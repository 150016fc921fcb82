"""OpenAI Responses API surface: ``POST /v1/responses`` (and ``/responses``).

``protocol`` holds the wire models, ``serving`` converts input items to rlgate's
conversation model and builds Response objects and streaming events, ``router`` wires
auth, parsing and JSON vs SSE. See docs/openai-responses.md.
"""
