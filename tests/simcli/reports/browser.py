"""Render a report in headless Chromium: screenshot, console messages, network requests.

CI installs Debian's ``chromium`` (``.ci/run``) and sets ``SIMCLI_REQUIRE_BROWSER=1``, so
there a missing browser fails the tests instead of skipping them.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


def chromium_path() -> str | None:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return None


@dataclass
class Rendered:
    screenshot: Path
    console: list[tuple[str, str]] = field(default_factory=list)
    page_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)
    text: str = ""
    svg_count: int = 0

    @property
    def console_errors(self) -> list[str]:
        return [t for kind, t in self.console if kind in ("error", "warning")] + self.page_errors

    @property
    def network_requests(self) -> list[str]:
        """Requests other than the page itself (file://, data: and about: are local)."""
        return [
            u for u in self.requests if not u.startswith(("file://", "data:", "about:", "blob:"))
        ]


def render(page_path: Path, screenshot: Path) -> Rendered:
    """Open ``page_path`` in headless Chromium and capture what it did."""
    exe = chromium_path()
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        exe = None
    if exe is None:
        if os.environ.get("SIMCLI_REQUIRE_BROWSER"):
            pytest.fail("headless Chromium (and the playwright package) are required here")
        pytest.skip("no chromium/playwright on this machine")
    out = Rendered(screenshot=screenshot)
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=exe, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.on("console", lambda m: out.console.append((m.type, m.text)))
            page.on("pageerror", lambda e: out.page_errors.append(str(e)))
            page.on("request", lambda r: out.requests.append(r.url))
            page.goto(Path(page_path).resolve().as_uri(), wait_until="load")
            page.screenshot(path=str(screenshot), full_page=True)
            out.text = page.inner_text("body")
            out.svg_count = page.locator("svg").count()
        finally:
            browser.close()
    return out


def assert_not_blank(png: Path, min_colours: int = 8, min_ink_fraction: float = 0.01) -> None:
    """The screenshot has real content: several colours and a share of non-white pixels."""
    from matplotlib.image import imread

    img = imread(str(png))[..., :3]
    flat = (img.reshape(-1, 3) * 255).astype(int)
    colours = len({tuple(p) for p in flat[:: max(1, len(flat) // 50000)]})
    ink = float((flat.sum(axis=1) < 3 * 245).mean())
    assert colours >= min_colours, f"screenshot {png} has only {colours} colours"
    assert ink >= min_ink_fraction, f"screenshot {png} is {ink:.1%} ink: blank"


def check_report(page_path: Path, tmp_path: Path, *, min_svgs: int = 1) -> Rendered:
    """Render, then assert: not blank, no console errors, no network requests, charts drawn."""
    shot = tmp_path / (Path(page_path).parent.name + "-report.png")
    rendered = render(page_path, shot)
    assert_not_blank(shot)
    assert rendered.console_errors == [], rendered.console_errors
    assert rendered.network_requests == [], rendered.network_requests
    assert rendered.svg_count >= min_svgs, f"{rendered.svg_count} charts, wanted {min_svgs}"
    return rendered


def one_error_line(result) -> str:
    """The CLI failed on bad input: exit 2 and exactly one ``error: ...`` line on stderr."""
    assert result.exit_code == 2, (result.exit_code, result.output)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.stderr
    return lines[0]
