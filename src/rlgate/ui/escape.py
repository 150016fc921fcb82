"""Escaping data for the viewer's HTML: markup, and characters a reader cannot see.

Every string that comes from data (messages, model output, ids, tasks) is hostile. Besides
HTML markup (``html.escape``), it may hold characters that change what a reader sees without
showing themselves: bidirectional controls (U+202A-U+202E, U+2066-U+2069, U+200E, U+200F,
U+061C) reorder the text around them ("Trojan Source", CVE-2021-42574), and zero-width or
other format characters (Unicode category Cf: U+200B, U+FEFF, the U+E0000 tag characters...),
control characters and blank fillers hide text or make two different strings look alike.
None of them reaches a page raw; each is shown as a visible escape (a run of them as one,
repeats counted: ``⟨U+200B⟩×40``, so hostile text costs a few bytes per character):

* :func:`e` (safe anywhere: element text, attribute values, ``<title>``, ``<option>``): the
  plain text ``⟨U+202E⟩``;
* :func:`et` (element text): the same escape in a styled ``<kbd class="cc">``;
* :func:`ev` (an attribute whose exact value matters, e.g. a hidden form field, never shown):
  a character reference ``&#x202e;``;
* :func:`ejson` (JSON text in an element, e.g. the raw request): a styled ``\\u202e``, so the
  text stays the JSON it was.

Tab, line feed and carriage return are kept (the token strip shows ``↵`` and ``→`` itself).
"""

from __future__ import annotations

import html
import re
from typing import Any

# Cc (controls) except \t \n \r; Cf (format characters, Unicode 15, plus the reserved U+2065 and
# U+FFF0-U+FFF8 between them); U+2028 / U+2029 (line and paragraph separators: a paragraph
# separator ends every bidi embedding); the Hangul fillers, which render blank.
INVISIBLE_CLASS = (
    "[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u00ad\u0600-\u0605\u061c\u06dd\u070f\u0890\u0891\u08e2"
    "\u115f\u1160\u180e\u200b-\u200f\u2028-\u202e\u2060-\u206f\u3164\ufeff\uffa0\ufff0-\ufffb"
    "\U000110bd\U000110cd\U00013430-\U0001343f\U0001bca0-\U0001bca3\U0001d173-\U0001d17a"
    "\U000e0001\U000e0020-\U000e007f]"
)
INVISIBLE = re.compile(INVISIBLE_CLASS)
_RUN = re.compile(INVISIBLE_CLASS + "+")  # a run of them is shown in one escape

def code_point(ch: str) -> str:
    """``⟨U+202E⟩``: how an invisible character is shown."""
    return f"⟨U+{ord(ch):04X}⟩"


def code_points(run: str) -> str:
    """A run of invisible characters: ``⟨U+202E⟩⟨U+2066⟩``, repeats counted (``⟨U+200B⟩×40``)."""
    out, k = [], 0
    while k < len(run):
        j = k + 1
        while j < len(run) and run[j] == run[k]:
            j += 1
        out.append(code_point(run[k]) + (f"×{j - k}" if j - k > 1 else ""))
        k = j
    return "".join(out)


def _plain(m: re.Match[str]) -> str:
    return code_points(m.group())


def _styled(m: re.Match[str]) -> str:
    return f'<kbd class="cc">{code_points(m.group())}</kbd>'


def _json_escape(ch: str) -> str:
    c = ord(ch)
    if c < 0x10000:
        return f"\\u{c:04x}"
    c -= 0x10000
    return f"\\u{0xD800 + (c >> 10):04x}\\u{0xDC00 + (c & 0x3FF):04x}"


def _styled_json(m: re.Match[str]) -> str:
    return f'<kbd class="cc">{"".join(map(_json_escape, m.group()))}</kbd>'


def e(x: Any) -> str:
    """HTML-escaped, invisible characters as plain ``⟨U+XXXX⟩``: safe in any context."""
    s = html.escape(str(x), quote=True)
    return _RUN.sub(_plain, s) if INVISIBLE.search(s) else s


def et(x: Any) -> str:
    """HTML-escaped element text, invisible characters as styled ``⟨U+XXXX⟩`` (not for attributes)."""
    s = html.escape(str(x), quote=True)
    return _RUN.sub(_styled, s) if INVISIBLE.search(s) else s


def ev(x: Any) -> str:
    """An attribute value that must keep its exact value (a hidden form field): HTML-escaped,
    invisible characters as numeric character references (``&#x202e;``): never raw in the page,
    and never shown."""
    s = html.escape(str(x), quote=True)
    return INVISIBLE.sub(_reference, s) if INVISIBLE.search(s) else s


def _reference(m: re.Match[str]) -> str:
    return f"&#x{ord(m.group()):x};"


def ejson(text: str) -> str:
    """JSON text (``ensure_ascii=False``) for an element: invisible characters as styled ``\\uXXXX``."""
    s = html.escape(text, quote=True)
    return _RUN.sub(_styled_json, s) if INVISIBLE.search(s) else s
