"""A small bounded cache for rendering by-products (the assistant suffix of a template).

One :class:`RenderCache` belongs to one session (``Session.render_cache``), so what a
session's requests put in it goes away with the session. It is bounded twice: at most
``max_entries`` values (least recently used evicted first), and a value longer than
``max_value_chars`` is never kept (it is recomputed when needed). Rendering may run on a
worker thread, so every access takes a lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

MAX_ENTRIES = 16  # distinct (tools, template kwargs) contexts a session renders with at once
MAX_VALUE_CHARS = 4096  # a chat template's assistant suffix is a few characters ("<|im_end|>\n")


class RenderCache:
    def __init__(self, max_entries: int = MAX_ENTRIES, max_value_chars: int = MAX_VALUE_CHARS) -> None:
        self.max_entries = max_entries
        self.max_value_chars = max_value_chars
        self._data: OrderedDict[str, str] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, key: str) -> str | None:
        with self._lock:
            value = self._data.get(key)
            if value is not None:
                self._data.move_to_end(key)
            return value

    def put(self, key: str, value: str) -> None:
        if len(value) > self.max_value_chars:
            return
        with self._lock:
            self._data[key] = value
            self._data.move_to_end(key)
            while len(self._data) > self.max_entries:
                self._data.popitem(last=False)

    def __len__(self) -> int:
        return len(self._data)

    def chars(self) -> int:
        """Characters held (keys and values): what the bound is about."""
        with self._lock:
            return sum(len(k) + len(v) for k, v in self._data.items())
