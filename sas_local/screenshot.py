"""A screenshot of the operators' dashboard, for docs/dashboard.png.

`make run DEMO_ARGS="--screenshot docs/dashboard.png"` takes it once the demo's orders have
finished, before the stack stops; `python -m sas_local.screenshot URL` takes one of a running
app. The orders in Error are shown and the first (if any) opened, so its timeline and the
Resubmit button show.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from playwright.sync_api import ViewportSize, sync_playwright

from sas_local.browser import launch

VIEWPORT: ViewportSize = {"width": 1400, "height": 1000}


def capture(dashboard_url: str, out: Path, *, open_state: str | None = "Error") -> Path:
    out.parent.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as playwright:
        browser = launch(playwright)
        try:
            page = browser.new_page(viewport=VIEWPORT)
            page.goto(dashboard_url)
            page.wait_for_selector("#updated-at:not([data-refreshes='0'])")
            if open_state is not None:
                page.click(f"#counts .card[data-state='{open_state}']")  # those orders only
                page.wait_for_timeout(2000)  # the refresh the click started lists them
                rows = page.locator(f"#orders tbody tr[data-state='{open_state}']")
                if rows.count():
                    rows.first.click()
                    page.wait_for_selector("#timeline:not([hidden]) #history tbody tr")
            page.screenshot(path=str(out), full_page=True)
        finally:
            browser.close()
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Screenshot the sas dashboard.")
    parser.add_argument("url", help="the dashboard's URL, e.g. http://127.0.0.1:7071/api/dashboard")
    parser.add_argument("--out", type=Path, default=Path("docs/dashboard.png"))
    args = parser.parse_args(argv)
    print(capture(args.url, args.out))


if __name__ == "__main__":
    main()
