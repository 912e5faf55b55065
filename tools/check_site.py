"""Every page of the built documentation site fits a window 1,280 pixels wide: each page is loaded in
headless Chromium (tools/browser.py) and each table wider than its container (its first header
cells named) and each page wider than the window is reported.

    python tools/check_site.py SITE_DIR        # after mkdocs build --site-dir SITE_DIR (tox -e docs)

Exit 0: everything fits; 1: something does not (one line each, page by page); 2: no such site, or
Chromium missing where the environment variable CI is set (without CI a missing Chromium is a
note and exit 0, as the browser tests skip).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run as a script from anywhere
from tools import browser

PROG = "python tools/check_site.py"


def pages(site: Path) -> list[Path]:
    """The site's HTML pages, in path order (mkdocs' own 404 page and search assets aside)."""
    return sorted(p for p in site.rglob("*.html") if p.name != "404.html" and "assets" not in p.parts)


def problems(page: Path, site: Path, *, width: int = browser.WIDTH) -> list[str]:
    """What does not fit on ``page``, each line naming the page (relative to ``site``): the page
    wider than the window, each table wider than its container. Svgs are the page's own business
    (a diagram in a scroll box is fine)."""
    found = browser.measure(page, width=width)
    name = page.relative_to(site).as_posix()
    said = []
    if found["scrollWidth"] > found["window"]:
        said.append(f"{name}: the page is {found['scrollWidth']} px wide in a window of {found['window']} px")
    said += [f"{name}: table ({', '.join(t['head'])}) runs {t['over']} px past its box "
             f"({t['width']} px wide, the box {t['container']} px)" for t in found["tables"] if not t["fits"]]
    return said


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("site", help="the built site's folder (mkdocs build --site-dir)")
    parser.add_argument("--width", type=int, default=browser.WIDTH, help="window width in pixels (1280)")
    args = parser.parse_args(argv)
    site = Path(args.site)
    if not site.is_dir() or not pages(site):
        print(f"{PROG}: no built site at {site} (run mkdocs build first)", file=sys.stderr)
        return 2
    if browser.chromium() is None:
        message = f"Chromium is needed to check the site's widths: {browser.INSTALL}"
        if os.environ.get("CI"):
            print(f"{PROG}: {message}", file=sys.stderr)
            return 2
        print(f"{PROG}: not checked: {message}")
        return 0
    found = [line for page in pages(site) for line in problems(page, site, width=args.width)]
    for line in found:
        print(line)
    print(f"{PROG}: {len(pages(site))} pages at {args.width} px, "
          + (f"{len(found)} too wide" if found else "everything fits"))
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
