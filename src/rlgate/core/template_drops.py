"""Reporting what a chat template left out of a request (``chat/template_support.py``): a counter per
part, and one warning per part per gateway (a run of thousands of episodes logs it once)."""

from __future__ import annotations

import logging

from rlgate.metrics.gateway import GatewayMetrics

log = logging.getLogger("rlgate.generation")

__all__ = ["TemplateDrops"]

_WHAT = {
    "tools": "tools (the tools= of the request)",
    "tool_calls": "the tool calls of assistant turns it renders afresh",
    "tool_results": "tool results",
    "reasoning": "the reasoning of assistant turns it renders afresh",
}
_REMEDY = {
    "tools": "; --tool-prompt auto (a training config: gateway: {tool_prompt: auto}) describes them in the system "
             "message in the format the tool parser reads (docs/http-api.md#tools-a-template-cannot-show)",
    "tool_calls": "; --tool-prompt auto writes them as the tool-call text the model produced",
}


class TemplateDrops:
    def __init__(self, metrics: GatewayMetrics, family: str) -> None:
        self.metrics = metrics
        self.family = family
        self._warned: set[str] = set()

    def report(self, parts: list[str], api: str) -> None:
        """A request whose prompt left ``parts`` out was accepted (``api``: the surface that served it)."""
        for part in parts:
            self.metrics.record_template_dropped(part, api)
            if part in self._warned:
                continue
            self._warned.add(part)
            if part == "images":
                log.warning("a request carries images: rlgate's engines take token ids, so the model sees the chat "
                            "template's image placeholder at most, never the image (x-rlgate-template-dropped: "
                            "images; counted in rlgate_template_dropped_total); logged once")
            else:
                log.warning("a request carries %s, which the %s chat template does not render: the model never sees "
                            "them (x-rlgate-template-dropped: %s; counted in rlgate_template_dropped_total)%s; logged "
                            "once", _WHAT[part], self.family, part, _REMEDY.get(part, ""))
