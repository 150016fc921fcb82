"""The Anthropic Messages surface: ``POST /v1/messages`` and ``/v1/messages/count_tokens``.

* :mod:`~rlgate.api.anthropic.protocol` — wire models (request side), API reference order;
* :mod:`~rlgate.api.anthropic.serving` — Anthropic ⇄ internal conversation converter,
  Message building and the SSE event generator;
* :mod:`~rlgate.api.anthropic.router` — the two routes (auth, parse, prepare, JSON vs SSE).

Errors use Anthropic's envelope ``{"type": "error", "error": {"type", "message"}}``
(before the stream: an HTTP error; during it: an ``event: error``). See
``docs/anthropic-messages.md`` for what is supported and the decisions taken.
"""
