"""The operators' dashboard: one HTML page, its script and style inlined when it is served.

No build step and nothing fetched from elsewhere: the three files ship inside the sas package.
The page carries no key: in Azure it is opened with ``?code=<function key>`` and sends that key
on its own API calls. Its Content-Security-Policy allows exactly the inlined script and style
(by hash) and API calls to its own origin.
"""

from __future__ import annotations

import base64
import hashlib
from dataclasses import dataclass
from functools import cache
from importlib import resources


@dataclass(frozen=True)
class Page:
    html: str
    content_security_policy: str


def _sha256(text: str) -> str:
    return "'sha256-" + base64.b64encode(hashlib.sha256(text.encode()).digest()).decode() + "'"


@cache
def page() -> Page:
    files = resources.files(__name__)
    script = files.joinpath("dashboard.js").read_text(encoding="utf-8")
    style = files.joinpath("dashboard.css").read_text(encoding="utf-8")
    html = (
        files.joinpath("index.html")
        .read_text(encoding="utf-8")
        .replace("<style></style>", f"<style>{style}</style>")
        .replace("<script></script>", f"<script>{script}</script>")
    )
    policy = "; ".join(
        (
            "default-src 'none'",
            f"script-src {_sha256(script)}",
            f"style-src {_sha256(style)}",
            "connect-src 'self'",
            "img-src 'self' data:",
            "base-uri 'none'",
            "form-action 'none'",
            "frame-ancestors 'none'",
        )
    )
    return Page(html, policy)
