"""The ``renderers`` package (Apache-2.0) as the engine of a family's prompts, behind our interface.

``renderers`` hand-codes each family's chat template in Python (token for token, parity-tested
upstream against the official templates) and bridges a sampled turn to the next one without
re-tokenizing it (``bridge_to_next_turn``). This adapter converts rlgate's messages to its
message dicts and maps its answers onto :class:`~rlgate.chat.families.base.PromptRenderer`.

Bridge policy: rlgate always asks for ``thinking_retention="all"`` — the parent's reasoning stays
in the token sequence whatever the template would drop — because that is what token-exact
means. A fresh rendering (``rerender`` mode, first turns, forks) is the checkpoint's own chat
template (Hugging Face ``apply_chat_template``, what vLLM and SGLang serve), byte for byte: the
package's rendering differs from it in places (Qwen3 with ``enable_thinking: false`` wrote an
empty ``<think>`` block on every earlier assistant turn, the template on none), and "rerender"
promises what the model sees at deployment. The package renders only for a tokenizer without a
template.
The bridge's result is accepted only if it starts with the parent's prompt and output tokens
exactly (the package may close a truncated turn, which then becomes part of our bridge).

Bounds (issue 15): the package renders hand-coded templates message by message and never
builds a text the client controls beyond the messages themselves, which the caller bounded
by characters before calling (``GenerationService.build_prompt``); ``max_chars`` is checked
on the messages' text here too. Client template kwargs reach only the typed config fields
the package validates. Renderers run on worker threads, so the config cache takes a lock.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

from rlgate.chat.conversation import Message, ToolSpec, canonical_json
from rlgate.chat.families.base import REASONING_TAIL, BridgeError, ModelFamily, ParentTurn, TemplateError
from rlgate.chat.prompt_bounds import check_chars
from rlgate.chat.render_cache import RenderCache
from rlgate.chat.token_text import decode

_MAX_CONFIGS = 32  # distinct template-kwarg sets kept per gateway

# A family's rewrite of the messages before they are rendered: (messages, parent turn when
# bridging, tokenizer) -> messages (Kimi-K2: tool-call ids as the model writes them).
Prepare = Callable[[list[Message], ParentTurn | None, Any], list[Message]]


def to_renderers_message(msg: Message) -> dict[str, Any]:
    """rlgate message -> ``renderers.Message`` (OpenAI chat shape, arguments as objects)."""
    out: dict[str, Any] = {"role": msg.role, "content": msg.text}
    if msg.reasoning:
        out["reasoning_content"] = msg.reasoning
    if msg.tool_calls:
        out["tool_calls"] = [
            {"id": tc.id, "type": "function",
             "function": {"name": tc.name, "arguments": _args(tc.arguments)}}
            for tc in msg.tool_calls
        ]
    if msg.tool_call_id is not None:
        out["tool_call_id"] = msg.tool_call_id
    if msg.name is not None:
        out["name"] = msg.name
    return out


def _args(raw: str) -> Any:
    try:
        obj = json.loads(raw) if raw.strip() else {}
    except (json.JSONDecodeError, ValueError):
        return raw
    return obj if isinstance(obj, dict) else raw


class RenderersRenderer:
    """A :class:`~rlgate.chat.families.base.PromptRenderer` backed by one ``renderers`` renderer."""

    def __init__(self, tokenizer: Any, renderer_name: str, *, options: dict[str, Any] | None = None,
                 generation_prefix: str = "", reasoning_start: str | None = "<think>",
                 prepare: Prepare | None = None) -> None:
        from renderers import config_from_name

        self.name = f"renderers:{renderer_name}"
        self.tokenizer = tokenizer
        self._config_cls = type(config_from_name(renderer_name))
        self._options = dict(options or {})
        # Text a family's template appends to the generation prompt that the package's renderer
        # does not (Qwen3-Thinking-2507: "<think>\n", which the package maps to plain Qwen3).
        self._prefix_ids = list(tokenizer.encode(generation_prefix, add_special_tokens=False)) if generation_prefix else []
        self.reasoning_start = reasoning_start
        self._prepare = prepare
        self._renderers: dict[str, Any] = {}
        self._lock = threading.Lock()
        self._renderer({})  # fail at startup, not on the first request
        self._jinja: Any = None  # the checkpoint's own template, when the package declines a bridge

    def _renderer(self, template_kwargs: dict[str, Any] | None) -> Any:
        key = canonical_json(template_kwargs or {})
        with self._lock:
            r = self._renderers.get(key)
            if r is None:
                r = self._renderers[key] = self._new_renderer(template_kwargs)
                if len(self._renderers) > _MAX_CONFIGS:
                    self._renderers.pop(next(iter(self._renderers)))
            return r

    def _new_renderer(self, template_kwargs: dict[str, Any] | None) -> Any:
        from renderers import create_renderer, merge_chat_template_kwargs

        config = self._config_cls(**{"thinking_retention": "all", **self._options})
        try:
            config = merge_chat_template_kwargs(config, template_kwargs or None)
        except (ValueError, TypeError) as exc:
            raise TemplateError(f"unsupported chat template arguments: {exc}") from exc
        return create_renderer(self.tokenizer, config)

    @staticmethod
    def _tools(tools: list[ToolSpec] | None) -> list[dict[str, Any]] | None:
        return [t.to_openai() for t in tools] if tools else None

    def _template(self) -> Any:
        """The checkpoint's own template (a :class:`~rlgate.chat.render.ChatRenderer`), or None."""
        if not getattr(self.tokenizer, "chat_template", None):
            return None
        with self._lock:
            if self._jinja is None:
                from rlgate.chat.render import ChatRenderer

                self._jinja = ChatRenderer(self.tokenizer, reasoning_start=self.reasoning_start)
            return self._jinja

    def render_ids(self, messages: list[Message], tools: list[ToolSpec] | None = None,
                   template_kwargs: dict[str, Any] | None = None, *, max_chars: int | None = None) -> list[int]:
        check_chars_of(messages, max_chars)
        template = self._template()
        if template is not None:  # a fresh rendering is the checkpoint's template (module docstring)
            if self._prepare is not None:
                messages = self._prepare(messages, None, self.tokenizer)
            self._renderer(template_kwargs)  # the package's checks of the template kwargs, as for a bridge
            return list(template.render_ids(messages, tools, template_kwargs, max_chars=max_chars))
        r = self._renderer(template_kwargs)
        try:
            if self._prepare is not None:
                messages = self._prepare(messages, None, self.tokenizer)
            ids = list(r.render_ids([to_renderers_message(m) for m in messages], tools=self._tools(tools),
                                    add_generation_prompt=True))
        except (ValueError, TypeError, KeyError, AssertionError) as exc:
            raise TemplateError(f"the {self.name} renderer refused the conversation: {exc}") from exc
        return ids + self._prefix_ids

    def bridge_ids(self, *, parent: ParentTurn, leading_system: Message | None, new_messages: list[Message],
                   tools: list[ToolSpec] | None = None, template_kwargs: dict[str, Any] | None = None,
                   cache_key: str | None = None, cache: RenderCache | None = None,
                   max_chars: int | None = None) -> list[int]:
        check_chars_of(new_messages, max_chars)
        r = self._renderer(template_kwargs)
        head = parent.prompt_ids + parent.output_ids
        given = new_messages
        if self._prepare is not None:
            new_messages = self._prepare(new_messages, parent, self.tokenizer)
        try:
            out = r.bridge_to_next_turn(parent.prompt_ids, parent.output_ids,
                                        [to_renderers_message(m) for m in new_messages], tools=self._tools(tools))
        except (ValueError, TypeError, KeyError, AssertionError) as exc:
            raise BridgeError(f"the {self.name} renderer could not bridge: {exc}") from exc
        if out is None:
            # The package declines some turns it could append to (Qwen3: a reply that ended inside
            # unclosed reasoning); the checkpoint's own template bridges those (the generic
            # sentinel bridge), instead of a new root.
            return self._jinja_bridge(parent, leading_system, given, tools, template_kwargs, cache_key, cache,
                                      max_chars)
        ids = list(out.token_ids)
        if ids[: len(head)] != head:
            raise BridgeError(f"the {self.name} bridge rewrote the parent's tokens")
        return ids[len(head):] + self._prefix_ids

    def _jinja_bridge(self, parent: ParentTurn, leading_system: Message | None, new_messages: list[Message],
                      tools: list[ToolSpec] | None, template_kwargs: dict[str, Any] | None, cache_key: str | None,
                      cache: RenderCache | None, max_chars: int | None) -> list[int]:
        template = self._template()
        if template is None:
            raise BridgeError(f"the {self.name} renderer cannot append these messages to the parent's tokens")
        # its own cache entries: the template's assistant suffix, not the package's
        key = f"jinja:{cache_key}" if cache_key is not None else None
        return list(template.bridge_ids(parent=parent, leading_system=leading_system, new_messages=new_messages,
                                           tools=tools, template_kwargs=template_kwargs, cache_key=key, cache=cache,
                                           max_chars=max_chars))

    def reasoning_open(self, prompt_ids: list[int]) -> bool:
        if not self.reasoning_start or not prompt_ids:
            return False
        text = decode(self.tokenizer, prompt_ids[-REASONING_TAIL:])
        return text.rstrip().endswith(self.reasoning_start)


def check_chars_of(messages: list[Message], max_chars: int | None) -> None:
    """:class:`~rlgate.chat.prompt_bounds.PromptTooLong` if the messages' text alone is over ``max_chars``."""
    if max_chars is not None:
        check_chars("".join(m.text + (m.reasoning or "") for m in messages), max_chars)


def renderers_backend(renderer_name: str, **kw: Any) -> Any:
    """``ModelFamily.build_renderer`` for a family backed by the ``renderers`` package."""

    def build(tokenizer: Any, family: ModelFamily) -> RenderersRenderer:
        return RenderersRenderer(tokenizer, renderer_name, options=dict(family.options), **kw)

    return build
