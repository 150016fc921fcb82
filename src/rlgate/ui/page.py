"""The viewer's page shell: inline CSS + JS (one self-contained file) under a strict CSP.

The stylesheet and script are inlined and allowed by their SHA-256 hashes, so the page
needs no network and nothing else can run: ``default-src 'none'`` (no fetch, no images
from anywhere, no frames), no inline event handlers, no ``style`` attributes. The static
export carries the same policy in a ``<meta>`` tag; ``/ui`` sends it as a header too.
"""

from __future__ import annotations

import base64
import functools
import hashlib
from importlib import resources

from rlgate.ui.render import e


@functools.cache
def assets() -> tuple[str, str]:
    """(css, js) of the viewer (read once; immutable)."""
    base = resources.files("rlgate.ui") / "static"
    return (base / "viewer.css").read_text(encoding="utf-8"), (base / "viewer.js").read_text(encoding="utf-8")


def _sha256(text: str) -> str:
    return "sha256-" + base64.b64encode(hashlib.sha256(text.encode("utf-8")).digest()).decode()


@functools.cache
def content_security_policy() -> str:
    css, js = assets()
    return (f"default-src 'none'; style-src '{_sha256(css)}'; script-src '{_sha256(js)}'; "
            "img-src data:; form-action 'self'; base-uri 'none'; frame-ancestors 'none'")


SECURITY_HEADERS = {
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "Cross-Origin-Opener-Policy": "same-origin",
}


def document(title: str, main: str, *, mode: str, header_extra: str = "", templates: str = "") -> str:
    """A whole HTML page. ``mode``: "live" (/ui) or "static" (views in ``templates``; main filled by JS)."""
    css, js = assets()
    # frame-ancestors is ignored in a <meta> policy (the header carries it for /ui)
    meta_csp = content_security_policy().replace("; frame-ancestors 'none'", "")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f'<meta http-equiv="Content-Security-Policy" content="{e(meta_csp)}">'
        '<meta name="referrer" content="same-origin">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f"<title>{e(title)}</title><style>{css}</style></head>"
        f'<body data-mode="{e(mode)}"><header class="top"><span class="brand">rlgate</span>'
        f'<span>trajectory viewer</span>{header_extra}</header><main>{main}</main>'
        f'<div id="tip" class="tip" hidden></div>{templates}<script>{js}</script></body></html>'
    )
