"""Load a local HTML page in headless Chromium at a given window width and read back what the page
measured: the document's width against the window's, and each table and SVG against its container.

    python tools/browser.py PAGE.html [--width 1280] [--screenshot OUT.png]

`measure(path)` copies the page beside itself with a script added at its end that, once the page
has loaded, writes a JSON of the measurements into the DOM; Chromium prints the DOM
(``--dump-dom``, after a virtual-time budget long enough for the load) and the JSON is read back
from it. The page itself is never changed. `screenshot` takes a picture to look at. Chromium is
run with no profile of its own (a temporary ``--user-data-dir``), no GPU, no network services.
"""

from __future__ import annotations

import argparse
import html
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

WIDTH = 1280
"""The window width the pages must fit (a laptop's)."""
HEIGHT = 900
INSTALL = "install Chromium: apt-get install -y chromium (Debian), or put it on PATH as chromium"
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
         "--disable-background-networking", "--disable-component-update", "--disable-sync")
MARK = "browser-measurements"

MEASURE = """
<script>
window.addEventListener("load", function () {
  var doc = document.documentElement;
  function container(el) {  // the nearest ancestor that clips or scrolls, else the parent
    for (var p = el.parentElement; p && p !== doc; p = p.parentElement) {
      var o = getComputedStyle(p).overflowX;
      if (o === "auto" || o === "scroll" || o === "hidden") return p;
    }
    return el.parentElement || doc;
  }
  function fits(el) {
    var box = el.getBoundingClientRect(), parent = container(el), outer = parent.getBoundingClientRect();
    var inner = parent.clientWidth || outer.width;
    var over = Math.max(box.right - (outer.left + inner), outer.left - box.left, 0);
    return {width: Math.round(box.width), container: Math.round(inner), over: Math.round(over),
            fits: over <= 1};
  }
  var found = {window: window.innerWidth, scrollWidth: doc.scrollWidth, tables: [], svgs: []};
  document.querySelectorAll("table").forEach(function (t) {
    var r = fits(t);
    r.head = Array.prototype.slice.call(t.querySelectorAll("th"), 0, 3).map(function (c) {
      return c.textContent.trim(); });
    found.tables.push(r);
  });
  document.querySelectorAll("svg").forEach(function (s) {
    var r = fits(s);
    r.cls = s.getAttribute("class") || "";
    found.svgs.push(r);
  });
  var out = document.createElement("pre");
  out.id = "MARK";
  out.textContent = JSON.stringify(found);
  document.body.appendChild(out);
});
</script>
""".replace("MARK", MARK)


def chromium() -> str | None:
    """The Chromium executable (``/usr/bin/chromium`` or one on PATH), or None."""
    for name in ("chromium", "chromium-browser", "google-chrome"):
        found = shutil.which(name)
        if found:
            return found
    return "/usr/bin/chromium" if os.access("/usr/bin/chromium", os.X_OK) else None


def _run(args: list[str], timeout: float) -> str:
    exe = chromium()
    if exe is None:
        raise FileNotFoundError(f"Chromium not found: {INSTALL}")
    with tempfile.TemporaryDirectory(prefix="chromium-") as profile:
        done = subprocess.run([exe, *FLAGS, f"--user-data-dir={profile}", *args], capture_output=True,
                              text=True, timeout=timeout, check=False)
    if done.returncode != 0:
        raise RuntimeError(f"chromium exited {done.returncode}: {done.stderr.strip()[-500:]}")
    return done.stdout


def measure(path: str | Path, *, width: int = WIDTH, timeout: float = 60.0) -> dict[str, Any]:
    """What the page at ``path`` measures at a window ``width`` pixels wide: ``window`` (its inner
    width), ``scrollWidth`` (the document's), and for each table (``head``: its first three header
    cells) and each svg (``cls``: its class) its ``width``, its ``container``'s width (the nearest
    ancestor that scrolls or clips, else its parent), how many pixels it runs ``over`` the
    container's edges, and whether it ``fits`` (over by at most a pixel).
    Raises FileNotFoundError when Chromium is missing."""
    page = Path(path).resolve()
    text = page.read_text(encoding="utf-8")
    at = text.lower().rfind("</body>")
    probe = text[:at] + MEASURE + text[at:] if at >= 0 else text + MEASURE
    with tempfile.NamedTemporaryFile("w", suffix=".html", dir=page.parent, encoding="utf-8",
                                     delete=False) as copy:  # beside the page: its relative links hold
        copy.write(probe)
    try:
        dom = _run([f"--window-size={width},{HEIGHT}", "--virtual-time-budget=10000", "--dump-dom",
                    Path(copy.name).as_uri()], timeout)
    finally:
        os.unlink(copy.name)
    found = re.search(rf'<pre id="{MARK}">(.*?)</pre>', dom, re.S)
    if found is None:
        raise RuntimeError(f"the page {page} did not report its measurements (did it load?)")
    return dict(json.loads(html.unescape(found.group(1))))


def screenshot(path: str | Path, out: str | Path, *, width: int = WIDTH, height: int = 2400,
               timeout: float = 60.0) -> Path:
    """A PNG of the page at ``path`` in a window ``width`` × ``height`` pixels, written to ``out``."""
    target = Path(out).resolve()
    _run([f"--window-size={width},{height}", "--hide-scrollbars", f"--screenshot={target}",
          Path(path).resolve().as_uri()], timeout)
    return target


def overflows(found: dict[str, Any]) -> list[str]:
    """What does not fit, one line each: the page wider than its window, each table and svg wider
    than its container."""
    said = []
    if found["scrollWidth"] > found["window"]:
        said.append(f"the page is {found['scrollWidth']} px wide in a window of {found['window']} px")
    said += [f"table ({', '.join(t['head'])}) runs {t['over']} px past its container ({t['width']} px wide, "
             f"the container {t['container']} px)" for t in found["tables"] if not t["fits"]]
    said += [f"svg {s['cls']!r} runs {s['over']} px past its container ({s['width']} px wide, the container "
             f"{s['container']} px)" for s in found["svgs"] if not s["fits"]]
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python tools/browser.py", description=__doc__.splitlines()[0])
    parser.add_argument("page")
    parser.add_argument("--width", type=int, default=WIDTH)
    parser.add_argument("--screenshot", metavar="PNG")
    args = parser.parse_args(argv)
    try:
        if args.screenshot:
            print(screenshot(args.page, args.screenshot, width=args.width))
            return 0
        found = measure(args.page, width=args.width)
    except (FileNotFoundError, RuntimeError, OSError) as e:
        print(f"python tools/browser.py: {e}", file=sys.stderr)
        return 2
    print(json.dumps(found, indent=1))
    bad = overflows(found)
    for line in bad:
        print(line, file=sys.stderr)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
