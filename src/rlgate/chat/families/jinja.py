"""Building block: a family rendered by its own Jinja chat template (:class:`~rlgate.chat.render.ChatRenderer`)."""

from __future__ import annotations

from typing import Any

from rlgate.chat.families.base import ModelFamily, PromptRenderer


def jinja_backend(*, reasoning_start: str | None = "<think>", close_aliases: dict[str, str] | None = None,
                  **default_kwargs: Any) -> Any:
    """``ModelFamily.build_renderer`` for a family rendered by the checkpoint's own template."""

    def build(tokenizer: Any, family: ModelFamily) -> PromptRenderer:
        from rlgate.chat.render import ChatRenderer

        return ChatRenderer(tokenizer, reasoning_start=reasoning_start, default_kwargs=default_kwargs,
                            close_aliases=close_aliases)

    return build
