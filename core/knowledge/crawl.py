"""Reads a website into `Document`s: robots.txt, sitemaps or link discovery, bounded and polite."""

from __future__ import annotations

import asyncio
import logging
import zlib
from collections import deque
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Mapping
from contextlib import aclosing
from dataclasses import dataclass
from typing import Any
from urllib.parse import urljoin, urlsplit
from urllib.robotparser import RobotFileParser
from xml.etree.ElementTree import ParseError

import aiohttp
import lxml.html  # type: ignore[import-untyped]
from defusedxml.ElementTree import fromstring as parse_xml
from lxml.etree import LxmlError  # type: ignore[import-untyped]

from core.documents import Document, ReadError
from core.knowledge.extract import extract_page, normalise_url, same_host
from core.knowledge.outbound import REFUSED, PrivateAddressRefused, is_guarded

log = logging.getLogger(__name__)

SITEMAP_MAX_BYTES = 50_000_000  # the sitemap protocol's own limit, uncompressed
ROBOTS_MAX_BYTES = 500_000  # what Google reads of a robots.txt
SITEMAP_MAX_DEPTH = 2  # an index of indexes is not allowed by the protocol, but exists
MAX_REDIRECTS = 5
_CHUNK = 64 * 1024
_REDIRECTS = frozenset({301, 302, 303, 307, 308})
_HTML_TYPES = frozenset({"text/html", "application/xhtml+xml"})
_GONE = frozenset({404, 410})
_DISALLOW_ALL = ("User-agent: *", "Disallow: /")
# Links to these are not pages; skipping them saves a request each.
_NOT_PAGES = (
    ".pdf", ".jpg", ".jpeg", ".png", ".gif", ".webp", ".svg", ".ico", ".css", ".js", ".json",
    ".xml", ".gz", ".zip", ".mp3", ".mp4", ".mov", ".webm", ".woff", ".woff2", ".ttf",
    ".doc", ".docx", ".xls", ".xlsx", ".ppt", ".pptx", ".csv", ".txt",
)  # fmt: skip


@dataclass(frozen=True, slots=True)
class CrawlLimits:
    """How much of a site one crawl may read, and how fast."""

    max_pages: int = 500
    concurrency: int = 4
    max_bytes: int = 3_000_000  # per page, after decompression
    timeout: float = 20.0  # seconds per request, body included
    user_agent: str = "ParleyBot/0.1"


@dataclass(frozen=True, slots=True)
class Unchanged:
    """A page that answered 304 Not Modified to a conditional request: keep what is indexed."""

    url: str


CrawlItem = Document | ReadError | Unchanged


@dataclass(frozen=True, slots=True)
class _Response:
    url: str  # after same-site redirects
    headers: Mapping[str, str]
    body: bytes


@dataclass(frozen=True, slots=True)
class _Skipped:
    reason: str


@dataclass(frozen=True, slots=True)
class _HttpError:
    status: int

    def error(self, url: str) -> ReadError:
        # a page that is gone is no longer ours to keep indexed; other failures may pass
        return ReadError(url, f"HTTP {self.status}", None if self.status in _GONE else url)


class _NotModified:
    pass


_Fetched = _Response | _Skipped | _NotModified | _HttpError | ReadError


def _connect_reason(exc: aiohttp.ClientConnectorError) -> str:
    # Fixed phrases only: the errors' own texts name the address and port tried, and these
    # reasons reach staff, to whom they would map the servers behind ours.
    if isinstance(exc.os_error, PrivateAddressRefused):
        return REFUSED
    if isinstance(exc, aiohttp.ClientConnectorDNSError):
        return "could not connect: host not found"
    if isinstance(exc.os_error, ConnectionRefusedError):
        return "could not connect: connection refused"
    return "could not connect"


async def _read_body(response: aiohttp.ClientResponse, limit: int) -> bytes | None:
    """The body, or None as soon as it turns out larger than ``limit`` bytes."""
    if response.content_length is not None and response.content_length > limit:
        return None
    chunks: list[bytes] = []
    size = 0
    async for chunk in response.content.iter_chunked(_CHUNK):
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


class _Fetcher:
    """GET with our user agent, a timeout, a size limit and redirects kept on the site."""

    def __init__(self, session: aiohttp.ClientSession, limits: CrawlLimits, site: str) -> None:
        self._session = session
        self._limits = limits
        self._site = site
        self._timeout = aiohttp.ClientTimeout(total=limits.timeout)
        self.robots: RobotFileParser | None = None

    def allowed(self, url: str) -> bool:
        return self.robots is None or self.robots.can_fetch(self._limits.user_agent, url)

    async def get(
        self,
        url: str,
        *,
        max_bytes: int,
        html_only: bool = False,
        headers: Mapping[str, str] | None = None,
        claim: Callable[[str], bool] | None = None,
    ) -> _Fetched:
        """One URL; ``claim`` decides whether a redirect target is ours to read."""
        try:
            return await self._get(url, max_bytes, html_only, headers or {}, claim)
        except TimeoutError:
            return ReadError(url, f"timed out after {self._limits.timeout:g} s", url)
        except aiohttp.ClientConnectorError as exc:
            return ReadError(url, _connect_reason(exc), url)
        except (aiohttp.ClientError, ValueError) as exc:
            return ReadError(url, f"request failed: {type(exc).__name__} {exc}".strip(), url)

    async def _get(
        self,
        url: str,
        max_bytes: int,
        html_only: bool,
        headers: Mapping[str, str],
        claim: Callable[[str], bool] | None,
    ) -> _Fetched:
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            async with self._session.get(
                current,
                headers={"User-Agent": self._limits.user_agent, **headers},
                allow_redirects=False,
                timeout=self._timeout,
            ) as response:
                if response.status in _REDIRECTS and "Location" in response.headers:
                    target = normalise_url(urljoin(current, response.headers["Location"]))
                    if refusal := self._refuse_redirect(target, claim):
                        return _Skipped(f"redirect to {target} ({refusal})")
                    current = target
                    continue
                return await self._answer(response, current, url, max_bytes, html_only)
        return ReadError(url, f"more than {MAX_REDIRECTS} redirects", url)

    def _refuse_redirect(self, target: str, claim: Callable[[str], bool] | None) -> str | None:
        if not same_host(target, self._site):
            return "off site"
        if not self.allowed(target):
            return "disallowed by robots.txt"
        if claim is not None and not claim(target):
            return "read on its own"
        return None

    async def _answer(
        self,
        response: aiohttp.ClientResponse,
        current: str,
        url: str,
        max_bytes: int,
        html_only: bool,
    ) -> _Fetched:
        if response.status == 304:
            return _NotModified()
        if response.status >= 400:
            return _HttpError(response.status)
        if response.status >= 300:
            return ReadError(url, f"HTTP {response.status} without a usable Location", url)
        declared = "Content-Type" in response.headers  # no type at all: try it as HTML
        if html_only and declared and response.content_type not in _HTML_TYPES:
            return _Skipped(f"not HTML ({response.content_type})")
        body = await _read_body(response, max_bytes)
        if body is None:
            return ReadError(url, f"larger than {max_bytes} bytes", url)
        return _Response(current, {k.lower(): v for k, v in response.headers.items()}, body)


def _local_name(tag: Any) -> str:
    return str(tag).rsplit("}", 1)[-1]


def _gunzip(data: bytes, limit: int) -> bytes:
    inflater = zlib.decompressobj(wbits=zlib.MAX_WBITS | 16)
    try:
        out = inflater.decompress(data, limit + 1)
    except zlib.error as exc:
        raise ValueError(f"broken gzip ({exc})") from exc
    if len(out) > limit:
        raise ValueError(f"larger than {limit} bytes unpacked")
    return out


def parse_sitemap(body: bytes) -> tuple[list[str], list[str]]:
    """(page URLs, child sitemap URLs) of a sitemap, sitemap index or gzipped either."""
    if body[:2] == b"\x1f\x8b":
        body = _gunzip(body, SITEMAP_MAX_BYTES)
    if not body.lstrip().startswith(b"<"):
        # the protocol allows a plain list of URLs, one a line
        lines = body.decode("utf-8", "replace").split()
        return [line for line in lines if line.startswith(("http://", "https://"))], []
    try:
        root = parse_xml(body)
    except (ParseError, ValueError) as exc:
        raise ValueError(f"invalid XML ({exc})") from exc
    kind = _local_name(root.tag)
    if kind not in ("urlset", "sitemapindex"):
        raise ValueError(f"root element is <{kind}>")
    locations = [
        (child.text or "").strip()
        for entry in root
        if _local_name(entry.tag) in ("url", "sitemap")
        for child in entry
        if _local_name(child.tag) == "loc"
    ]
    locations = [loc for loc in locations if loc]
    return (locations, []) if kind == "urlset" else ([], locations)


def page_links(html: bytes, url: str) -> list[str]:
    """The http(s) pages a page links to, absolute and normalised, in order, without files."""
    try:
        tree = lxml.html.document_fromstring(html)
    except (LxmlError, ValueError):
        return []
    base = urljoin(url, (tree.xpath("//base/@href") or [""])[0].strip())
    links: list[str] = []
    for href in tree.xpath("//a/@href"):
        try:
            target = urljoin(base, str(href).strip())
            parts = urlsplit(target)
        except ValueError:
            continue
        if parts.scheme in ("http", "https") and not parts.path.lower().endswith(_NOT_PAGES):
            links.append(normalise_url(target))
    return list(dict.fromkeys(links))


def _read_page(
    body: bytes, url: str, headers: Mapping[str, str], follow: bool
) -> tuple[Document, list[str]]:
    links = page_links(body, url) if follow else []
    return extract_page(body, url, headers=headers), links


class _Crawl:
    """The state of one crawl: what was seen, what is left, what has been yielded."""

    def __init__(
        self,
        start_url: str,
        session: aiohttp.ClientSession,
        limits: CrawlLimits,
        validators: Mapping[str, tuple[str | None, str | None]],
        on_page: Callable[[], None] | None,
    ) -> None:
        self._given = start_url
        self._start = normalise_url(start_url)
        self._limits = limits
        self._fetcher = _Fetcher(session, limits, self._start)
        self._validators = {normalise_url(url): (url, v) for url, v in validators.items()}
        self._on_page = on_page
        self._seen: set[str] = set()
        self._yielded: set[str] = set()
        self._scheduled = 0
        self._follow_links = False
        self._todo: asyncio.Queue[str] = asyncio.Queue()
        self._results: asyncio.Queue[CrawlItem | None] = asyncio.Queue(
            maxsize=2 * max(1, limits.concurrency)
        )

    @property
    def _origin(self) -> str:
        parts = urlsplit(self._start)
        return f"{parts.scheme}://{parts.netloc}"

    async def run(self) -> AsyncGenerator[CrawlItem, None]:
        parts = urlsplit(self._start)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            yield ReadError(self._given, "not an http(s) URL")
            return
        problem = await self._load_robots()
        if problem is not None:
            yield problem
            return
        async for error in self._plan():
            yield error
        log.info(
            "crawl.started url=%s pages=%d follow_links=%s",
            self._start,
            self._scheduled,
            self._follow_links,
        )
        async with aclosing(self._pages()) as pages:
            async for item in pages:
                yield item
        log.info("crawl.finished url=%s pages=%d", self._start, self._scheduled)

    async def _load_robots(self) -> ReadError | None:
        """Reads robots.txt; a ReadError when the site cannot be reached or refuses us."""
        url = f"{self._origin}/robots.txt"
        result = await self._fetcher.get(url, max_bytes=ROBOTS_MAX_BYTES)
        robots = RobotFileParser(url)
        if isinstance(result, _Response):
            robots.parse(result.body.decode("utf-8", "replace").splitlines())
        elif isinstance(result, _HttpError):
            if result.status >= 500:
                # RFC 9309: a server error on robots.txt means nothing may be crawled yet
                return ReadError(self._given, f"robots.txt answered HTTP {result.status}")
            # as urllib.robotparser does: 401/403 forbid everything, other 4xx nothing
            robots.parse(_DISALLOW_ALL if result.status in (401, 403) else [])
        elif isinstance(result, ReadError):
            return ReadError(self._given, result.reason)
        else:
            robots.parse([])  # a robots.txt redirected off site does not apply here
        self._fetcher.robots = robots
        return None

    async def _plan(self) -> AsyncIterator[ReadError]:
        """Schedules the sitemaps' pages, or the start page when links must be followed."""
        given = urlsplit(self._start).path.lower().endswith((".xml", ".xml.gz"))
        if given:
            candidates, implicit = [self._start], False
        else:
            robots = self._fetcher.robots
            candidates = [normalise_url(u) for u in (robots.site_maps() if robots else None) or []]
            implicit = not candidates
            candidates = candidates or [f"{self._origin}/sitemap.xml"]
        pages, errors = await self._read_sitemaps(candidates, implicit=implicit)
        for error in errors:
            yield error
        if given or pages:
            for page in pages:
                self._schedule(page)
            return
        self._follow_links = True
        if not self._fetcher.allowed(self._start):
            yield ReadError(self._given, "disallowed by robots.txt")
            return
        self._schedule(self._start)

    async def _read_sitemaps(
        self, candidates: list[str], *, implicit: bool
    ) -> tuple[list[str], list[ReadError]]:
        pages: list[str] = []
        errors: list[ReadError] = []
        queue = deque((url, 0) for url in candidates)
        visited: set[str] = set()
        while queue and len(pages) < self._limits.max_pages:
            url, depth = queue.popleft()
            if url in visited or depth > SITEMAP_MAX_DEPTH:
                continue
            visited.add(url)
            problem = self._sitemap_refusal(url, declared=depth == 0 and not implicit)
            if problem is None:
                result = await self._fetcher.get(url, max_bytes=SITEMAP_MAX_BYTES)
                try:
                    found, children = self._sitemap_content(result)
                except ValueError as exc:
                    problem = str(exc)
                else:
                    log.info(
                        "crawl.sitemap.read url=%s pages=%d sitemaps=%d",
                        url,
                        len(found),
                        len(children),
                    )
                    pages += found
                    queue.extend((child, depth + 1) for child in map(normalise_url, children))
                    continue
            if implicit and depth == 0:
                log.info("crawl.sitemap.absent url=%s reason=%s", url, problem)
            else:
                log.warning("crawl.sitemap.failed url=%s reason=%s", url, problem)
                errors.append(ReadError(url, problem))
        return pages, errors

    def _sitemap_refusal(self, url: str, *, declared: bool) -> str | None:
        if not same_host(url, self._start):
            return "sitemap on another site"
        if not declared and not self._fetcher.allowed(url):
            return "disallowed by robots.txt"
        return None

    @staticmethod
    def _sitemap_content(result: _Fetched) -> tuple[list[str], list[str]]:
        if isinstance(result, ReadError):
            raise ValueError(result.reason)
        if isinstance(result, _HttpError):
            raise ValueError(f"HTTP {result.status}")
        if not isinstance(result, _Response):
            raise ValueError("no sitemap")
        return parse_sitemap(result.body)

    def _schedule(self, url: str) -> None:
        url = normalise_url(url)
        if url in self._seen or self._scheduled >= self._limits.max_pages:
            return
        self._seen.add(url)
        if not same_host(url, self._start):
            log.info("crawl.page.skipped url=%s reason=%s", url, "off site")
        elif not self._fetcher.allowed(url):
            log.info("crawl.page.skipped url=%s reason=%s", url, "disallowed by robots.txt")
        else:
            self._scheduled += 1
            self._todo.put_nowait(url)

    def _claim(self, url: str) -> bool:
        """A redirect target is read once: not when it is (or will be) read on its own."""
        if url in self._seen:
            return False
        self._seen.add(url)
        return True

    async def _pages(self) -> AsyncGenerator[CrawlItem, None]:
        workers = [
            asyncio.create_task(self._work()) for _ in range(max(1, self._limits.concurrency))
        ]
        finisher = asyncio.create_task(self._finish())
        try:
            while (item := await self._results.get()) is not None:
                yield item
        finally:
            for task in (*workers, finisher):
                task.cancel()
            await asyncio.gather(*workers, finisher, return_exceptions=True)

    async def _finish(self) -> None:
        await self._todo.join()
        await self._results.put(None)

    async def _work(self) -> None:
        while True:
            url = await self._todo.get()
            try:
                item = await self._visit(url)
            except Exception as exc:  # one odd page must not end the crawl; it is reported
                log.exception("crawl.page.failed url=%s", url)
                item = ReadError(url, f"could not read the page ({type(exc).__name__})", url)
            try:
                if item is not None:
                    await self._results.put(item)
            finally:
                self._todo.task_done()

    def _conditional_headers(self, url: str) -> tuple[str, dict[str, str]]:
        key, (etag, last_modified) = self._validators.get(url, (url, (None, None)))
        headers = {}
        if etag:
            headers["If-None-Match"] = etag
        if last_modified:
            headers["If-Modified-Since"] = last_modified
        return key, headers

    async def _visit(self, url: str) -> CrawlItem | None:
        key, headers = self._conditional_headers(url)
        result = await self._fetcher.get(
            url,
            max_bytes=self._limits.max_bytes,
            html_only=True,
            headers=headers,
            claim=self._claim,
        )
        if self._on_page is not None:
            self._on_page()
        if isinstance(result, _NotModified):
            return Unchanged(key)
        if isinstance(result, _Skipped):
            log.info("crawl.page.skipped url=%s reason=%s", url, result.reason)
            if self._follow_links and url == self._start:
                # nothing else will be read: say why rather than end with nothing
                return ReadError(self._given, f"start page skipped: {result.reason}")
            return None
        if isinstance(result, _HttpError):
            result = result.error(url)
        if isinstance(result, ReadError):
            log.info("crawl.page.failed url=%s reason=%s", url, result.reason)
            return result
        return await self._document(url, result)

    async def _document(self, url: str, response: _Response) -> Document | None:
        document, links = await asyncio.to_thread(
            _read_page, response.body, response.url, response.headers, self._follow_links
        )
        for link in links:
            self._schedule(link)
        if document.url in self._yielded:
            log.info("crawl.page.skipped url=%s reason=%s", url, f"same page as {document.url}")
            return None
        self._yielded.add(document.url)
        return document


async def crawl(
    start_url: str,
    session: aiohttp.ClientSession,
    limits: CrawlLimits = CrawlLimits(),
    *,
    validators: Mapping[str, tuple[str | None, str | None]] | None = None,
    on_page: Callable[[], None] | None = None,
) -> AsyncIterator[Document | ReadError | Unchanged]:
    """The pages of one site, as they are read.

    Pages come from the site's sitemaps (robots.txt ``Sitemap:`` lines, else
    ``/sitemap.xml``, or ``start_url`` itself when it is one); without a sitemap, from
    following links breadth-first from ``start_url``. Only pages on the start URL's site
    that robots.txt allows are requested, at most ``limits.max_pages`` of them.

    ``validators`` maps a page URL to the (ETag, Last-Modified) it had; such a page is
    requested conditionally and comes back as `Unchanged` when the server says 304.
    A page that cannot be read comes back as a `ReadError` and the crawl goes on; a site
    that cannot be reached at all gives one `ReadError`. ``on_page`` is called after
    each page request, whatever its outcome.

    ``session`` must come from `core.knowledge.outbound.crawler_session`, which refuses
    to connect to private addresses (the pages read may end up in front of anyone).
    """
    if not is_guarded(session):
        raise TypeError("crawl() needs a session from outbound.crawler_session()")
    items = _Crawl(start_url, session, limits, validators or {}, on_page).run()
    async with aclosing(items):
        async for item in items:
            yield item
