"""The widget script route, and the demo shop served with the chat bubble on every page."""

from __future__ import annotations

import asyncio
import hashlib
import html
import mimetypes
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

DEMO_SITE = Path(__file__).resolve().parents[1] / "bench" / "data" / "shop"
WIDGET_JS = Path(__file__).resolve().parent / "static" / "widget.js"
# Browsers ask every site for /favicon.ico; the sample shop has none of its own.
FAVICON = Path(__file__).resolve().parent / "static" / "favicon.ico"

# Short enough that a new widget reaches visitors within minutes; the ETag makes the
# revalidation after that a 304.
_WIDGET_CACHE_CONTROL = "public, max-age=300"
_PAGE_CACHE_CONTROL = "no-cache"
_BODY_END = b"</body>"
_TEXT_TYPES = ("text/", "application/xml", "application/json", "application/javascript")


@dataclass(frozen=True, slots=True)
class DemoSite:
    """What `parley serve --demo` serves: the site's folder and the agent its widget talks to."""

    site_dir: Path
    agent: str
    widget_key: str


@dataclass(frozen=True, slots=True)
class _Script:
    body: bytes
    etag: str  # unquoted; aiohttp quotes it, and it is strong (no W/)


class _WidgetFile:
    """widget.js as served: re-read when the file changes, so an edit needs no restart."""

    def __init__(self, path: Path) -> None:
        self._path = path
        self._stamp: tuple[int, int] | None = None
        self._script: _Script | None = None

    def load(self) -> _Script:
        stat = self._path.stat()
        stamp = (stat.st_mtime_ns, stat.st_size)
        script = self._script
        if script is None or stamp != self._stamp:
            body = self._path.read_bytes()
            script = _Script(body, hashlib.sha256(body).hexdigest()[:32])
            self._script, self._stamp = script, stamp
        return script


def _not_modified(request: web.Request, etag: str) -> bool:
    # If-None-Match uses the weak comparison (RFC 9110 13.1.2), so W/"x" matches "x".
    given = request.if_none_match or ()
    return any(tag.value in ("*", etag) for tag in given)


async def _serve_widget(request: web.Request, widget: _WidgetFile) -> web.Response:
    try:
        script = await asyncio.to_thread(widget.load)
    except FileNotFoundError:
        raise web.HTTPNotFound(reason="widget.js is missing from this installation") from None
    headers = {"Cache-Control": _WIDGET_CACHE_CONTROL, "X-Content-Type-Options": "nosniff"}
    if _not_modified(request, script.etag):
        response = web.Response(status=304, headers=headers)
    else:
        response = web.Response(
            body=script.body,
            content_type="application/javascript",
            charset="utf-8",
            headers=headers,
        )
    response.etag = script.etag
    return response


def widget_routes() -> web.RouteTableDef:
    """`GET /widget.js`, the embeddable chat bubble; mounted with or without the demo."""
    routes = web.RouteTableDef()
    widget = _WidgetFile(WIDGET_JS)

    @routes.get("/widget.js")
    async def widget_js(request: web.Request) -> web.Response:
        return await _serve_widget(request, widget)

    return routes


def _resolve(root: Path, relative: str) -> Path | None:
    """The file `relative` names inside `root`, or None when it is missing or outside."""
    if not relative or "\x00" in relative or "\\" in relative:
        return None
    candidate = (root / relative).resolve()  # follows symlinks and `..` before the check
    if not candidate.is_relative_to(root):
        return None
    if any(part.startswith(".") for part in candidate.relative_to(root).parts):
        return None
    if candidate.is_dir():
        candidate = candidate / "index.html"
    return candidate if candidate.is_file() else None


def _with_script(page: bytes, tag: bytes) -> bytes:
    """The page with `tag` right before its last `</body>`; every other byte unchanged."""
    at = page.lower().rfind(_BODY_END)
    if at < 0:
        return page + tag
    return page[:at] + tag + page[at:]


def _read_page(root: Path, relative: str, tag: bytes) -> tuple[bytes, str, str | None] | None:
    """Body, content type and charset of the file `relative` names, or None."""
    path = _resolve(root, relative)
    if path is None:
        return None
    body = path.read_bytes()
    if path.suffix.lower() in (".html", ".htm"):
        return _with_script(body, tag), "text/html", "utf-8"
    kind = mimetypes.guess_type(path.name)[0] or "application/octet-stream"
    return body, kind, "utf-8" if kind.startswith(_TEXT_TYPES) else None


def _bundled_icon() -> tuple[bytes, str, str | None]:
    return FAVICON.read_bytes(), "image/x-icon", None


def demo_routes(site_dir: Path, agent: str, widget_key: str) -> web.RouteTableDef:
    """The static site at `site_dir` with the widget's script tag injected into every page.

    `/widget.js` is answered here too (the catch-all would otherwise shadow it when these
    routes are added first), so this table works with or without `widget_routes()`. A site
    without a `favicon.ico` of its own gets Parley's, so that browsers find one.
    """
    root = site_dir.resolve()
    tag = (
        f'<script src="/widget.js" data-agent="{html.escape(agent)}" '
        f'data-key="{html.escape(widget_key)}" async></script>\n'
    ).encode()
    widget = _WidgetFile(WIDGET_JS)
    routes = web.RouteTableDef()

    async def page(relative: str) -> web.Response:
        found = await asyncio.to_thread(_read_page, root, relative, tag)
        if found is None and relative == "favicon.ico":
            found = await asyncio.to_thread(_bundled_icon)
        if found is None:
            raise web.HTTPNotFound()
        body, kind, charset = found
        return web.Response(
            body=body,
            content_type=kind,
            charset=charset,
            headers={"Cache-Control": _PAGE_CACHE_CONTROL, "X-Content-Type-Options": "nosniff"},
        )

    @routes.get("/")
    async def index(request: web.Request) -> web.Response:
        return await page("index.html")

    @routes.get("/{path:.+}")
    async def site_file(request: web.Request) -> web.Response:
        relative = request.match_info["path"]
        if relative == "widget.js":
            return await _serve_widget(request, widget)
        return await page(relative)

    return routes
