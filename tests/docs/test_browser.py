"""The site and a report open in a real browser (issue 46): headless Chromium (Debian's `chromium`, which
scripts/ci-deps.sh installs) loads each kind of page from a local HTTP server, in a frame of a checking page of the
same origin that, once the page has loaded, counts its images and the ones that did not decode (a report's figures
are data: URIs, which no server sees). A page fails on any message in its console, any image that did not load, or
any request the server answers 404 (an image, stylesheet or script). Each page's screenshot is written beside the
test's files (pytest's tmp_path), for a person to look at.

Kinds: the home page (the SVG screenshot), a how-to, the generated CLI reference, an evidence page of wide tables,
the glossary, and a `ddptop report` page (report.html, its PNG figures embedded) from a shipped recording."""

from __future__ import annotations

import functools
import http.server
import os
import re
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from ports import port

ROOT = Path(__file__).resolve().parents[2]
IMAGES = {"index.html": 1, "report/report.html": 5}  # the screenshot; the report's figures (at least)
PAGES = ["index.html", "how-to/hand-in/index.html", "reference/cli/index.html", "evidence/whatif/index.html",
         "reference/glossary/index.html", "report/report.html"]
RECORDING = ROOT / "recordings" / "hpml-lab4-lab" / "hpml-lab4-lab-1node.db"  # the smallest shipped recording
CHECK = """<!doctype html><html><head><style>body{margin:0} iframe{border:0;width:100vw;height:100vh}</style></head>
<body><iframe id="page"></iframe><script>
const frame = document.getElementById("page");
frame.onload = () => {
  const images = [...frame.contentDocument.images];
  const bad = images.filter(i => !i.complete || i.naturalWidth === 0).map(i => i.src.slice(0, 80));
  console.log("ddptop-check: " + images.length + " images, " + bad.length + " not loaded " + JSON.stringify(bad));
};
frame.src = location.hash.slice(1);
</script></body></html>
"""


class Handler(http.server.SimpleHTTPRequestHandler):
    missing: list[str]

    def log_message(self, format, *args):  # noqa: A002 (http.server's own name)
        pass

    def send_error(self, code, message=None, explain=None):
        if code == 404 and not self.path.endswith("/favicon.ico"):  # the browser asks for one on its own
            self.missing.append(self.path)
        super().send_error(code, message, explain)


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    browser = shutil.which("chromium")
    if browser is None:
        pytest.skip("chromium is not installed (scripts/ci-deps.sh installs it)")
    root = tmp_path_factory.mktemp("served")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "PYTHONPATH": str(ROOT)}
    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(ROOT / "mkdocs.yml"), "-d",
                            str(root)], capture_output=True, text=True, timeout=300, cwd=ROOT, env=env)
    assert built.returncode == 0, built.stderr[-3000:]
    report = subprocess.run([sys.executable, "-m", "ddptop", "report", str(RECORDING), "-o", str(root / "report"),
                             "--formats", "png"], capture_output=True, text=True, timeout=300, cwd=root, env=env)
    assert report.returncode == 0, report.stderr[-3000:]
    (root / "check.html").write_text(CHECK)
    missing: list[str] = []
    handler = functools.partial(type("Logged", (Handler,), {"missing": missing}), directory=str(root))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", port()), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield browser, f"http://127.0.0.1:{server.server_address[1]}", missing
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("page", PAGES)
def test_each_kind_of_page_loads_without_a_console_message_or_a_missing_file(served, page, tmp_path):
    browser, base, missing = served
    missing.clear()
    shot = tmp_path / (page.replace("/", "-").removesuffix(".html") + ".png")
    done = subprocess.run([browser, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-extensions",
                           "--no-first-run", "--enable-logging=stderr", "--log-level=0", "--hide-scrollbars",
                           "--virtual-time-budget=5000", "--window-size=1280,1000", f"--screenshot={shot}",
                           f"{base}/check.html#/{page}"], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    console = [line for line in done.stderr.splitlines() if re.search(r":CONSOLE[:(]", line)]
    checked = [line for line in console if "ddptop-check: " in line]
    assert len(checked) == 1, f"{page}: the page never finished loading:\n{done.stderr[-3000:]}"
    images, bad = re.search(r"ddptop-check: (\d+) images, (\d+) not loaded", checked[0]).groups()
    assert bad == "0", f"{page}: images that did not load: {checked[0]}"
    assert int(images) >= IMAGES.get(page, 0), f"{page}: {images} images"
    others = [line for line in console if line not in checked]
    assert not others, f"{page}: the page logged to its console:\n" + "\n".join(others)
    assert not missing, f"{page}: the server had no {missing}"
    assert shot.is_file() and shot.stat().st_size > 10_000, f"{page}: no screenshot ({shot})"
    print(f"{page}: {shot}")
