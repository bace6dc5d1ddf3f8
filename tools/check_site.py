"""Every page of the built documentation site, loaded in a real browser (headless Chromium) at
1280 px, checked for what a reader would find cut off: a table wider than its column (or a cell
whose text overflows it), a code line that runs out of its block, a page that scrolls sideways;
the home page's set-up line must show whole; and no page may request anything from another host
(fonts and scripts from a CDN: the site must work offline).

    mkdocs build --strict -d /tmp/site
    python tools/check_site.py /tmp/site [--screenshots DIR] [--chromium /usr/bin/chromium]

Exit 0 when every page passes, 1 with one line per problem, 2 when the browser cannot run.

How: the site is served by `http.server` on 127.0.0.1 (a free port); Chromium is driven through
the DevTools protocol over `--remote-debugging-pipe` (JSON messages separated by NUL bytes on file
descriptors 3 and 4), so nothing beyond the standard library and Debian's `chromium` package is
needed: no WebSocket client, no browser download. The measurements run in the page
(`CHECK_PAGE`), after its load event and its fonts.
"""
from __future__ import annotations

import argparse
import base64
import functools
import http.server
import json
import os
import pathlib
import re
import select
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any

WIDTH, HEIGHT = 1280, 900
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", "--disable-quic",
         "--disable-default-apps", "--disable-extensions", "--mute-audio", "--hide-scrollbars")
LOAD_TIMEOUT_S = 60.0

# Run in each page; returns a list of problems, one line each. Material puts every table in a
# `.md-typeset__scrollwrap` that scrolls sideways: a table wider than it is cut off from view.
CHECK_PAGE = r"""
(() => {
  const problems = [];
  const text = (el) => ((el && (el.innerText || el.textContent)) || '').trim().replace(/\s+/g, ' ').slice(0, 90);
  const root = document.documentElement;
  if (root.scrollWidth > root.clientWidth + 1) {
    problems.push(`the page scrolls sideways (${root.scrollWidth} px in ${root.clientWidth} px)`);
  }
  const content = document.querySelector('.md-content') || document.body;
  // The text column (Material's, or another theme's main content): nothing may run past it.
  const column = (document.querySelector('.md-content__inner, [role=main], main') || document.body).getBoundingClientRect();
  for (const table of content.querySelectorAll('table')) {
    const box = table.closest('.md-typeset__scrollwrap') || table.parentElement;
    const edge = table.getBoundingClientRect().right;
    if (box.scrollWidth > box.clientWidth + 1 || edge > column.right + 1) {
      problems.push(`a table is cut off (${Math.round(Math.max(box.scrollWidth, edge - column.left))} px wide in ${Math.round(Math.min(box.clientWidth, column.width))} px): ${text(table.rows[0])}`);
    }
    // A cell is cut off when its text overflows it, or when it reaches past what its table's box
    // shows (a theme that keeps cells on one line lets them run out of a table of fixed width).
    const clip = Math.min(box.getBoundingClientRect().right, column.right);
    for (const cell of table.querySelectorAll('td, th')) {
      const cellRight = cell.getBoundingClientRect().right;
      if (cell.scrollWidth > cell.clientWidth + 1 || cellRight > clip + 1) {
        problems.push(`a table cell is cut off (${Math.round(cellRight - clip)} px past the edge): ${text(cell)}`);
      }
    }
  }
  for (const code of content.querySelectorAll('pre > code')) {
    const pre = code.parentElement;
    if (code.scrollWidth > code.clientWidth + 1 || pre.scrollWidth > pre.clientWidth + 1) {
      problems.push(`a code line is cut off (${code.scrollWidth} px in ${code.clientWidth} px): ${text(code)}`);
    }
  }
  const right = column.right;
  for (const el of content.querySelectorAll('p code, li code, img, pre')) {
    const r = el.getBoundingClientRect();
    if (r.width > 0 && r.right > right + 6) {  // an inline code span's own padding may overhang a little
      problems.push(`${el.tagName.toLowerCase()} runs past the text's right edge by ${Math.round(r.right - right)} px: ${text(el) || el.getAttribute('src')}`);
    }
  }
  return problems;
})()
"""

# The set-up line on the home page: shown whole, in one block, inside the text's width.
CHECK_LINE = r"""
((line) => {
  const blocks = [...document.querySelectorAll('.md-content pre > code')];
  const block = blocks.find((c) => c.textContent.split('\n').includes(line));
  if (!block) return [`the set-up line is not on the page: ${line}`];
  const r = block.getBoundingClientRect();
  const inner = document.querySelector('.md-content__inner').getBoundingClientRect();
  const problems = [];
  if (block.scrollWidth > block.clientWidth + 1) problems.push(`the set-up line is cut off: ${line}`);
  if (r.left < inner.left - 1 || r.right > inner.right + 1) problems.push(`the set-up block leaves the text column`);
  return problems;
})
"""


class BrowserError(Exception):
    """Chromium could not be started or stopped answering (exit 2)."""


class Chromium:
    """A headless Chromium driven over the DevTools protocol on a pipe."""

    def __init__(self, executable: str, profile: str) -> None:
        to_browser = os.pipe()  # we write commands, Chromium reads fd 3
        from_browser = os.pipe()  # Chromium writes fd 4, we read
        # Chromium reads fds 3 and 4: the pipe ends are put there by the shell that execs it, from
        # numbers above 9 (no clash with 3 and 4 whatever the pipes got).
        import fcntl

        child_in = fcntl.fcntl(to_browser[0], fcntl.F_DUPFD, 10)
        child_out = fcntl.fcntl(from_browser[1], fcntl.F_DUPFD, 10)
        args = [executable, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-pipe",
                f"--window-size={WIDTH},{HEIGHT}", "about:blank"]
        try:
            self.proc = subprocess.Popen(
                ["bash", "-c", f'exec "$@" 3<&{child_in} 4>&{child_out} {child_in}<&- {child_out}>&-', "bash", *args],
                pass_fds=(child_in, child_out), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL, start_new_session=True)
        except OSError as exc:
            raise BrowserError(f"cannot start {executable}: {exc}") from None
        finally:
            for fd in (to_browser[0], from_browser[1], child_in, child_out):
                os.close(fd)
        self.write_fd, self.read_fd = to_browser[1], from_browser[0]
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict[str, Any]] = []

    def close(self) -> None:
        try:
            self.send("Browser.close", timeout=5)
        except BrowserError:
            pass
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
        for fd in (self.write_fd, self.read_fd):
            try:
                os.close(fd)
            except OSError:
                pass

    def _read_message(self, deadline: float) -> dict[str, Any]:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0:
                raise BrowserError("Chromium did not answer in time")
            ready, _, _ = select.select([self.read_fd], [], [], left)
            if not ready:
                continue
            chunk = os.read(self.read_fd, 1 << 20)
            if not chunk:
                raise BrowserError("Chromium closed the DevTools pipe")
            self.buffer += chunk
        raw, self.buffer = self.buffer.split(b"\0", 1)
        return json.loads(raw)

    def send(self, method: str, params: dict[str, Any] | None = None, session: str | None = None,
             timeout: float = 30.0) -> dict[str, Any]:
        self.next_id += 1
        message: dict[str, Any] = {"id": self.next_id, "method": method, "params": params or {}}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._read_message(deadline)
            if reply.get("id") == self.next_id:
                if "error" in reply:
                    raise BrowserError(f"{method}: {reply['error'].get('message')}")
                return reply.get("result", {})
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float) -> dict[str, Any] | None:
        deadline = time.monotonic() + timeout
        while True:
            for n, event in enumerate(self.events):
                if event.get("method") == method:
                    return self.events.pop(n)
            try:
                self.events.append(self._read_message(deadline))
            except BrowserError:
                if time.monotonic() >= deadline:
                    return None
                raise

    def drain(self, quiet_s: float = 0.3, limit_s: float = 5.0) -> None:
        """Read events until none came for `quiet_s` (late requests: the search index, images)."""
        end = time.monotonic() + limit_s
        while time.monotonic() < end:
            try:
                self.events.append(self._read_message(time.monotonic() + quiet_s))
            except BrowserError as exc:
                if "in time" in str(exc):
                    return
                raise


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


def serve(site: pathlib.Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


def pages(site: pathlib.Path) -> list[str]:
    """Every built page, as a path below the site (index.html, scan/, ...)."""
    out = []
    for path in sorted(site.rglob("*.html")):
        rel = path.relative_to(site).as_posix()
        if rel == "404.html":
            continue
        out.append(rel[: -len("index.html")] if rel.endswith("index.html") else rel)
    return out


def setup_line(root: pathlib.Path) -> str:
    """The README's first command, which the home page shows as its set-up line."""
    block = re.search(r"^```sh\n(.*?)^```", (root / "README.md").read_text(), re.S | re.M)
    return next(line for line in block.group(1).splitlines() if line.strip() and not line.startswith("#"))


def check(site: pathlib.Path, chromium: str, screenshots: pathlib.Path | None, line: str) -> list[str]:
    server, base = serve(site)
    profile = tempfile.mkdtemp(prefix="gpudoctor-site-")
    browser = Chromium(chromium, profile)
    problems: list[str] = []
    try:
        target = browser.send("Target.createTarget", {"url": "about:blank"})["targetId"]
        session = browser.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
        for method in ("Page.enable", "Network.enable", "Runtime.enable"):
            browser.send(method, session=session)
        browser.send("Emulation.setDeviceMetricsOverride", {"width": WIDTH, "height": HEIGHT,
                                                           "deviceScaleFactor": 1, "mobile": False}, session=session)
        for page in pages(site):
            url = base + page
            browser.events.clear()
            browser.send("Page.navigate", {"url": url}, session=session)
            if browser.wait_for("Page.loadEventFired", LOAD_TIMEOUT_S) is None:
                problems.append(f"{page or '/'}: did not load in {LOAD_TIMEOUT_S:.0f} s")
                continue
            browser.send("Runtime.evaluate", {"expression": "document.fonts.ready.then(() => 1)",
                                              "awaitPromise": True}, session=session)
            browser.drain()
            for event in browser.events:
                if event.get("method") != "Network.requestWillBeSent":
                    continue
                asked = event["params"]["request"]["url"]
                if not (asked.startswith(base) or asked.split(":", 1)[0] in ("data", "blob", "about")):
                    problems.append(f"{page or '/'}: requests {asked[:200]} from another host")
            found = browser.send("Runtime.evaluate", {"expression": CHECK_PAGE, "returnByValue": True},
                                 session=session)["result"].get("value") or []
            if page == "":
                found += browser.send("Runtime.evaluate", {"expression": f"({CHECK_LINE})({json.dumps(line)})",
                                                           "returnByValue": True},
                                      session=session)["result"].get("value") or []
            problems += [f"{page or '/'}: {p}" for p in found]
            if screenshots is not None:
                shot = browser.send("Page.captureScreenshot", {"format": "png", "captureBeyondViewport": True},
                                    session=session, timeout=60)
                name = (page.strip("/").replace("/", "-") or "index").removesuffix(".html") + ".png"
                (screenshots / name).write_bytes(base64.b64decode(shot["data"]))
    finally:
        browser.close()
        server.shutdown()
        shutil.rmtree(profile, ignore_errors=True)
    return problems


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("site", type=pathlib.Path, help="the built site (mkdocs build -d SITE)")
    parser.add_argument("--screenshots", type=pathlib.Path, help="also save a full-page PNG of every page here")
    parser.add_argument("--chromium", default=shutil.which("chromium") or "/usr/bin/chromium")
    args = parser.parse_args(argv)
    if not (args.site / "index.html").is_file():
        print(f"check_site: {args.site} is not a built site (no index.html)", file=sys.stderr)
        return 2
    if args.screenshots is not None:
        args.screenshots.mkdir(parents=True, exist_ok=True)
    root = pathlib.Path(__file__).resolve().parents[1]
    try:
        problems = check(args.site, args.chromium, args.screenshots, setup_line(root))
    except BrowserError as exc:
        print(f"check_site: {exc}", file=sys.stderr)
        return 2
    for problem in problems:
        print(f"check_site: {problem}")
    n = len(pages(args.site))
    if problems:
        print(f"check_site: {len(problems)} problem{'s' * (len(problems) != 1)} on {n} pages at {WIDTH} px",
              file=sys.stderr)
        return 1
    print(f"check_site: {n} pages at {WIDTH} px in Chromium: nothing cut off, no request off the host")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
