"""Headless Chromium for the dashboard's end-to-end test and its screenshot: Debian's package
(`make chromium` installs it), driven by Playwright, which never downloads a browser of its own
here: the Makefile sets PLAYWRIGHT_SKIP_BROWSER_DOWNLOAD, and the executable is named."""

from __future__ import annotations

from pathlib import Path

from playwright.sync_api import Browser, Playwright

CHROMIUM = Path("/usr/bin/chromium")
# Headless and quiet: nothing of its own goes out on the network (no sync, component updates,
# background fetches, QUIC probes), and no sandbox, which needs privileges a container lacks.
CHROMIUM_ARGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)


class NoChromium(RuntimeError):
    pass


def launch(playwright: Playwright) -> Browser:
    if not CHROMIUM.exists():
        raise NoChromium(f"{CHROMIUM} is missing: `make chromium` installs Debian's package")
    return playwright.chromium.launch(
        executable_path=str(CHROMIUM), headless=True, args=list(CHROMIUM_ARGS)
    )
