"""The report page's blocks as one self-contained HTML file (figures embedded as PNG data, no outside files)."""

from __future__ import annotations

import base64
import html
import os
import re
from pathlib import Path

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;color:#222;
line-height:1.45}
table{border-collapse:collapse;font-size:12px;display:block;overflow-x:auto}th,td{border:1px solid #ccc;padding:2px 6px;
text-align:right;white-space:nowrap}th{background:#f3f3f3}td:nth-child(2),th:nth-child(2){text-align:left}
img{max-width:100%}blockquote{border-left:4px solid #c44e52;background:#fff4f4;margin:1em 0;padding:.5em 1em}
code{background:#f3f3f3;padding:0 3px}pre{background:#f3f3f3;padding:.6em;overflow-x:auto}.what{color:#333}"""


_CODE = re.compile(r"(?<!\\)`([^`]+?)(?<!\\)`")
_SAFE_HREF = re.compile(r"(?i)(https?://|#|[^:/?#]*(?:[/?#]|$))")  # web links, anchors, relative paths; no scheme


def _inline(text: str) -> str:
    """Markdown's inline marks as HTML. Everything is escaped first; a code span's text is then set aside, so no
    other mark applies inside it (a recorded command line `[x](javascript:…)` was a live link)."""
    out = html.escape(text, quote=False)
    spans: list[str] = []

    def keep(match: re.Match) -> str:
        spans.append(match.group(1))
        return f"\x00{len(spans) - 1}\x00"  # clean() strips control characters from every recorded text

    out = _CODE.sub(keep, out)
    # markup only where its characters are not escaped (markdown.untrusted escapes what came from a recording)
    out = re.sub(r"(?<!\\)\*\*(.+?)(?<!\\)\*\*", r"<b>\1</b>", out)
    out = re.sub(r"(?<!\\)\*([^*]+?)(?<!\\)\*", r"<i>\1</i>", out)
    out = re.sub(r"(?<!\\)\[([^\]]+)(?<!\\)\]\(([^)\s\x00]+)\)", _link, out)
    out = re.sub(r"\\(&lt;|&gt;|&amp;|[\\`*_\[\]|#])", r"\1", out)  # markdown's escapes (markdown.untrusted)
    return re.sub("\x00(\\d+)\x00", lambda m: f"<code>{spans[int(m.group(1))]}</code>", out)


def _link(match: re.Match) -> str:
    """A link whose target has no scheme but http(s): `javascript:…` (a recording named so) stays a relative path."""
    target = html.unescape(match.group(2))
    if not _SAFE_HREF.match(target):
        target = "./" + target
    return f'<a href="{html.escape(target)}">{match.group(1)}</a>'


def render(blocks: list[tuple], folder: Path, title: str) -> str:
    body = []
    for block in blocks:
        kind = block[0]
        if kind in ("h1", "h2", "h3"):
            body.append(f"<{kind}>{_inline(block[1])}</{kind}>")
        elif kind == "p":
            body.append(f"<p>{_inline(block[1])}</p>")
        elif kind == "warn":
            body.append(f"<blockquote>⚠ {_inline(block[1])}</blockquote>")
        elif kind == "list":
            body.append("<ul>" + "".join(f"<li>{_inline(i)}</li>" for i in block[1]) + "</ul>")
        elif kind == "code":
            body.append(f"<pre>{html.escape(block[1])}</pre>")
        elif kind == "table":
            head = "".join(f"<th>{html.escape(h)}</th>" for h in block[1])
            rows = "".join("<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in r) + "</tr>" for r in block[2])
            body.append(f"<table><tr>{head}</tr>{rows}</table>")
        elif kind == "figure":
            made = block[1]
            png = base64.b64encode(_own_file(folder / made.data["files"][0])).decode()
            body.append(f'<figure><img alt="{html.escape(made.title)}" src="data:image/png;base64,{png}">'
                        f'<figcaption class="what"><i>What this shows:</i> {html.escape(made.finding)}</figcaption>'
                        '</figure>')
    return (f"<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body>\n" + "\n".join(body) + "\n</body></html>\n")


def _own_file(path: Path) -> bytes:
    """A figure this report just wrote, read without following a link someone put in its place since."""
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    with os.fdopen(fd, "rb") as f:
        return f.read()
