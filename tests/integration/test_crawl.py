"""Crawling local websites over real HTTP: robots.txt, sitemaps, links, limits and validators."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from ipaddress import ip_network

import aiohttp
import pytest
from aiohttp import web
from aiohttp.abc import AbstractResolver, ResolveResult
from aiohttp.test_utils import TestServer
from pytest_aiohttp import AiohttpServer

from core.documents import Document, ReadError
from core.knowledge.crawl import (
    CrawlLimits,
    Unchanged,
    crawl,
    page_links,
    parse_sitemap,
)
from core.knowledge.outbound import crawler_session
from tests.support.services import LOOPBACK

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]

NAV = '<nav><a href="/">Home</a> <a href="/shop">Shop all sneakers</a> <a href="/story">Our story</a></nav>'
FOOTER = "<footer><p>Acme Running B.V. Chamber of Commerce 12345678</p></footer>"


def html_page(title: str, body: str, *, links: str = "", head: str = "", nav: str = NAV) -> str:
    return (
        f"<!doctype html><html lang='en'><head><title>{title}</title>{head}</head><body>"
        f"<header>{nav}</header><main><article>{body}</article>{links}</main>{FOOTER}"
        "</body></html>"
    )


def prose(subject: str) -> str:
    return (
        f"<h1>{subject}</h1><p>This page explains everything about {subject.lower()}. "
        "We answer within one working day and our team is happy to help with any question "
        "about orders, deliveries and the products in our range.</p>"
        f"<h2>More about {subject.lower()}</h2><p>Read the details below; they apply to every "
        "order placed in our web shop, whichever country you live in.</p>"
    )


def urlset(*urls: str) -> bytes:
    entries = "".join(f"<url><loc>{url}</loc></url>" for url in urls)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<urlset xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}</urlset>'
    ).encode()


def sitemap_index(*urls: str) -> bytes:
    entries = "".join(f"<sitemap><loc>{url}</loc></sitemap>" for url in urls)
    return (
        '<?xml version="1.0" encoding="UTF-8"?>'
        f'<sitemapindex xmlns="http://www.sitemaps.org/schemas/sitemap/0.9">{entries}'
        "</sitemapindex>"
    ).encode()


@dataclass
class Site:
    """A local website: handlers by path, and a record of every request it served."""

    routes: dict[str, Handler] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)
    in_flight: int = 0
    most_in_flight: int = 0
    server: TestServer | None = None

    @property
    def origin(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    def url(self, path: str) -> str:
        return f"{self.origin}{path}"

    def html(self, path: str, text: str, **headers: str) -> None:
        async def handler(request: web.Request) -> web.Response:
            return web.Response(text=text, content_type="text/html", headers=headers)

        self.routes[path] = handler

    def respond(self, path: str, handler: Handler) -> None:
        self.routes[path] = handler

    async def _handle(self, request: web.Request) -> web.StreamResponse:
        self.requests.append(request.path_qs)
        self.headers[request.path] = dict(request.headers)
        handler = self.routes.get(request.path)
        if handler is None:
            raise web.HTTPNotFound()
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        try:
            return await handler(request)
        finally:
            self.in_flight -= 1

    def pages_requested(self) -> list[str]:
        return [p for p in self.requests if p not in ("/robots.txt", "/sitemap.xml")]


def _app(site: Site) -> web.Application:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", site._handle)
    return app


async def start(site: Site, aiohttp_server: AiohttpServer) -> Site:
    site.server = await aiohttp_server(_app(site))
    return site


@pytest.fixture
async def session() -> AsyncIterator[aiohttp.ClientSession]:
    # the test sites listen on loopback, which only an allow-list lets a crawl reach
    async with crawler_session(LOOPBACK) as client:
        yield client


Item = Document | ReadError | Unchanged


async def collect(
    start_url: str,
    session: aiohttp.ClientSession,
    limits: CrawlLimits | None = None,
    *,
    validators: Mapping[str, tuple[str | None, str | None]] | None = None,
    on_page: Callable[[], None] | None = None,
) -> list[Item]:
    found = crawl(
        start_url, session, limits or CrawlLimits(), validators=validators, on_page=on_page
    )
    return [item async for item in found]


def documents(items: list[Item]) -> dict[str, Document]:
    return {item.url: item for item in items if isinstance(item, Document)}


def errors(items: list[Item]) -> dict[str, ReadError]:
    return {item.location: item for item in items if isinstance(item, ReadError)}


PRODUCT_JSON_LD = {
    "@context": "https://schema.org",
    "@graph": [
        {"@type": "WebPage", "name": "Trail Runner 2"},
        {
            "@type": "Product",
            "name": "Trail Runner 2",
            "sku": "TR-2",
            "offers": [
                {"@type": "Offer", "price": "129.95", "priceCurrency": "EUR",
                 "availability": "https://schema.org/InStock"},
            ],
        },
    ],
}  # fmt: skip


@pytest.fixture
async def elsewhere(aiohttp_server: AiohttpServer) -> Site:
    """Another site (another port: another host); nothing may ever be requested from it."""
    site = Site()
    site.html("/partner", html_page("Partner", prose("Partner offers")))
    site.html("/landing", html_page("Landing", prose("Landing page")))
    return await start(site, aiohttp_server)


@pytest.fixture
async def shop(aiohttp_server: AiohttpServer, elsewhere: Site) -> Site:
    """A shop with robots.txt, a gzipped sitemap behind a sitemap index, and trouble."""
    site = Site()
    await start(site, aiohttp_server)
    outside = f'<p><a href="{elsewhere.url("/partner")}">Our partner</a> <a href="mailto:info@acme.example">Mail us</a></p>'

    async def robots(request: web.Request) -> web.Response:
        return web.Response(
            text=f"User-agent: *\nDisallow: /private/\n\nSitemap: {site.url('/sitemap_index.xml')}\n"
        )

    async def index(request: web.Request) -> web.Response:
        return web.Response(
            body=sitemap_index(site.url("/sitemaps/pages.xml.gz")), content_type="application/xml"
        )

    async def pages(request: web.Request) -> web.Response:
        listed = urlset(
            site.url("/en/shipping"),
            site.url("/en/shipping#costs"),
            site.url("/nl/retourneren"),
            site.url("/products/trail-runner-2"),
            site.url("/contact"),
            site.url("/private/secret"),
            site.url("/missing"),
            site.url("/big"),
            site.url("/big-stream"),
            site.url("/files/manual.pdf"),
            site.url("/old-page"),
            site.url("/moved"),
            site.url("/renamed"),
            site.url("/slow"),
            elsewhere.url("/landing"),
        )
        return web.Response(body=gzip.compress(listed), content_type="application/gzip")

    async def redirect_away(request: web.Request) -> web.Response:
        raise web.HTTPFound(elsewhere.url("/landing"))

    async def redirect_home(request: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently("/nl/retourneren")

    async def redirect_new(request: web.Request) -> web.Response:
        raise web.HTTPMovedPermanently("/en/returns-policy")

    async def pdf(request: web.Request) -> web.Response:
        return web.Response(body=b"%PDF-1.4 manual", content_type="application/pdf")

    async def big_stream(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/html"})
        response.enable_chunked_encoding()
        await response.prepare(request)
        try:
            for _ in range(10):
                await response.write(b"<p>" + b"x" * 10_000 + b"</p>")
        except ConnectionError:
            pass  # the crawler hung up once it had seen enough
        return response

    async def slow(request: web.Request) -> web.Response:
        await asyncio.sleep(3)
        return web.Response(text=html_page("Slow", prose("Slow page")), content_type="text/html")

    site.respond("/robots.txt", robots)
    site.respond("/sitemap_index.xml", index)
    site.respond("/sitemaps/pages.xml.gz", pages)
    site.html("/en/shipping", html_page("Shipping", prose("Shipping and delivery"), links=outside))
    site.html("/nl/retourneren", html_page("Retourneren", prose("Returns"), links=outside))
    site.html(
        "/products/trail-runner-2",
        html_page(
            "Trail Runner 2",
            prose("Trail Runner 2"),
            head=f'<script type="application/ld+json">{json.dumps(PRODUCT_JSON_LD)}</script>',
        ),
    )
    site.html("/contact", html_page("Contact", prose("Contact"), links=outside))
    site.html("/private/secret", html_page("Secret", prose("Secret plans")))
    site.html("/big", html_page("Big", "<p>" + "y" * 30_000 + "</p>"))
    site.respond("/big-stream", big_stream)
    site.respond("/files/manual.pdf", pdf)
    site.respond("/old-page", redirect_away)
    site.respond("/moved", redirect_home)  # to a page the sitemap lists: read once
    site.respond("/renamed", redirect_new)  # to a page it does not list: read there
    site.html("/en/returns-policy", html_page("Returns policy", prose("Returns policy")))
    site.respond("/slow", slow)
    return site


SHOP_LIMITS = CrawlLimits(max_bytes=20_000, timeout=1.0)


@pytest.mark.parametrize("start_path", ["/", "/sitemap_index.xml"])
async def test_crawl_with_robots_and_sitemap(
    shop: Site, elsewhere: Site, session: aiohttp.ClientSession, start_path: str
) -> None:
    fetched: list[None] = []
    items = await collect(
        shop.url(start_path), session, SHOP_LIMITS, on_page=lambda: fetched.append(None)
    )

    docs = documents(items)
    assert sorted(docs) == [
        shop.url("/contact"),
        shop.url("/en/returns-policy"),
        shop.url("/en/shipping"),
        shop.url("/nl/retourneren"),
        shop.url("/products/trail-runner-2"),
    ]
    failed = errors(items)
    assert {location: e.reason for location, e in failed.items()} == {
        shop.url("/missing"): "HTTP 404",
        shop.url("/big"): "larger than 20000 bytes",
        shop.url("/big-stream"): "larger than 20000 bytes",
        shop.url("/slow"): "timed out after 1 s",
    }
    assert failed[shop.url("/missing")].url is None  # gone: not to be kept in the index
    assert failed[shop.url("/slow")].url == shop.url("/slow")  # may be back: keep it
    assert len(items) == len(docs) + len(failed)

    assert "/private/secret" not in shop.requests
    assert elsewhere.requests == []
    assert shop.requests.count("/en/shipping") == 1
    assert shop.requests.count("/robots.txt") == 1
    assert {"/files/manual.pdf", "/old-page", "/moved"} <= set(shop.requests)
    assert shop.requests.count("/nl/retourneren") == 1
    assert len(fetched) == 12  # every page request, whatever came of it

    shipping = docs[shop.url("/en/shipping")]
    assert shipping.text.startswith("# Shipping and delivery")
    assert "Shop all sneakers" not in shipping.text
    assert "Chamber of Commerce" not in shipping.text
    assert shipping.page_type == "policy"
    assert shipping.locale == "en"

    product = docs[shop.url("/products/trail-runner-2")]
    assert product.page_type == "product"
    assert product.product == {
        "name": "Trail Runner 2",
        "sku": "TR-2",
        "price": "129.95",
        "currency": "EUR",
        "availability": "InStock",
    }
    assert "SKU: TR-2" in product.text
    assert shop.headers["/en/shipping"]["User-Agent"] == "ParleyBot/0.1"


@pytest.fixture
async def blog(aiohttp_server: AiohttpServer, elsewhere: Site) -> Site:
    """A site without a sitemap, whose robots.txt only speaks to our crawler."""
    site = Site()
    partner = elsewhere.url("/partner")
    protocol_relative = "//" + elsewhere.url("/landing").split("://", 1)[1]

    async def robots(request: web.Request) -> web.Response:
        return web.Response(text="User-agent: ParleyBot\nDisallow: /drafts\n")

    async def download(request: web.Request) -> web.Response:
        return web.Response(body=b"%PDF-1.4", content_type="application/pdf")

    site.respond("/robots.txt", robots)
    site.html(
        "/",
        html_page(
            "Home",
            prose("Welcome"),
            links=(
                '<a href="/a">A</a> <a href="b#comments">B</a> <a href="/b">B again</a>'
                f'<a href="{partner}">Partner</a> <a href="{protocol_relative}">Landing</a>'
                '<a href="mailto:hello@blog.example">Mail</a> <a href="tel:+31201234567">Call</a>'
                '<a href="javascript:void(0)">Menu</a> <a href="/guide.pdf">Guide</a>'
                '<a href="/download">Download</a> <a href="/drafts/next">Draft</a>'
            ),
        ),
    )
    site.html("/a", html_page("A", prose("Article A"), links='<a href="/c">C</a>'))
    site.html("/b", html_page("B", prose("Article B"), links='<a href="/a">A</a>'))
    site.html("/c", html_page("C", prose("Article C"), links='<a href="/">Home</a>'))
    site.html("/drafts/next", html_page("Draft", prose("Draft")))
    site.html("/shop", html_page("Shop", prose("Shop")))  # linked from the navigation
    site.html("/story", html_page("Story", prose("Our story")))
    site.respond("/download", download)
    return await start(site, aiohttp_server)


async def test_link_discovery_without_a_sitemap(
    blog: Site, elsewhere: Site, session: aiohttp.ClientSession
) -> None:
    items = await collect(blog.url("/"), session)

    pages = ["/", "/a", "/b", "/c", "/shop", "/story"]
    assert sorted(documents(items)) == [blog.url(page) for page in pages]
    assert errors(items) == {}
    assert elsewhere.requests == []
    # mailto:, tel:, javascript:, the .pdf link and the disallowed draft were never requested;
    # /download was (nothing says it is a PDF until the answer) and then left out
    assert sorted(blog.pages_requested()) == sorted([*pages, "/download"])
    assert len(blog.pages_requested()) == len(set(blog.pages_requested()))
    assert blog.requests.count("/sitemap.xml") == 1  # looked for, not found


async def test_max_pages_is_respected(
    aiohttp_server: AiohttpServer, session: aiohttp.ClientSession
) -> None:
    site = Site()
    for n in range(20):
        links = f'<a href="/p/{n + 1}">next</a> <a href="/p/{n + 2}">after</a>'
        site.html(f"/p/{n}", html_page(f"Page {n}", prose(f"Page {n}"), links=links, nav=""))
    await start(site, aiohttp_server)

    items = await collect(site.url("/p/0"), session, CrawlLimits(max_pages=5))

    assert len(items) == 5
    assert all(isinstance(item, Document) for item in items)
    assert len(site.pages_requested()) == 5


async def test_concurrency_is_bounded(
    aiohttp_server: AiohttpServer, session: aiohttp.ClientSession
) -> None:
    site = Site()

    def slow_page(n: int) -> Handler:
        async def handler(request: web.Request) -> web.Response:
            await asyncio.sleep(0.05)
            return web.Response(
                text=html_page(f"P{n}", prose(f"Page {n}")), content_type="text/html"
            )

        return handler

    async def sitemap(request: web.Request) -> web.Response:
        return web.Response(body=urlset(*(site.url(f"/p/{n}") for n in range(12))))

    site.respond("/sitemap.xml", sitemap)
    for n in range(12):
        site.respond(f"/p/{n}", slow_page(n))
    await start(site, aiohttp_server)

    items = await collect(site.url("/"), session, CrawlLimits(concurrency=3))

    assert len(documents(items)) == 12
    assert site.most_in_flight == 3


async def test_conditional_requests_give_unchanged(
    aiohttp_server: AiohttpServer, session: aiohttp.ClientSession
) -> None:
    site = Site()
    modified = "Wed, 01 Oct 2025 10:00:00 GMT"

    async def with_etag(request: web.Request) -> web.Response:
        if request.headers.get("If-None-Match") == '"v1"':
            return web.Response(status=304)
        body = html_page("FAQ", prose("Frequently asked questions"))
        return web.Response(text=body, content_type="text/html", headers={"ETag": '"v1"'})

    async def with_date(request: web.Request) -> web.Response:
        if request.headers.get("If-Modified-Since") == modified:
            return web.Response(status=304)
        body = html_page("About", prose("About us"))
        return web.Response(
            text=body, content_type="text/html", headers={"Last-Modified": modified}
        )

    async def sitemap(request: web.Request) -> web.Response:
        return web.Response(body=urlset(site.url("/faq"), site.url("/about")))

    site.respond("/sitemap.xml", sitemap)
    site.respond("/faq", with_etag)
    site.respond("/about", with_date)
    await start(site, aiohttp_server)

    first = documents(await collect(site.url("/"), session))
    assert first[site.url("/faq")].etag == '"v1"'
    assert first[site.url("/about")].last_modified == modified

    validators = {url: (doc.etag, doc.last_modified) for url, doc in first.items()}
    second = await collect(site.url("/"), session, validators=validators)

    assert sorted(second, key=str) == sorted(
        [Unchanged(site.url("/faq")), Unchanged(site.url("/about"))], key=str
    )
    assert site.headers["/faq"]["If-None-Match"] == '"v1"'
    assert site.headers["/about"]["If-Modified-Since"] == modified


async def test_unreachable_start_url_gives_one_read_error(session: aiohttp.ClientSession) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    start_url = f"http://127.0.0.1:{port}/"  # nothing listens here any more

    items = await collect(start_url, session)

    assert len(items) == 1
    assert isinstance(items[0], ReadError)
    assert items[0].location == start_url
    assert items[0].reason == "could not connect: connection refused"
    assert str(port) not in items[0].reason  # no port scanning through the error texts


async def test_robots_server_error_means_no_crawl(
    aiohttp_server: AiohttpServer, session: aiohttp.ClientSession
) -> None:
    site = Site()

    async def broken(request: web.Request) -> web.Response:
        raise web.HTTPServiceUnavailable()

    site.respond("/robots.txt", broken)
    site.html("/", html_page("Home", prose("Welcome")))
    await start(site, aiohttp_server)

    items = await collect(site.url("/"), session)

    assert items == [ReadError(site.url("/"), "robots.txt answered HTTP 503")]
    assert site.requests == ["/robots.txt"]


def test_parse_sitemap_kinds() -> None:
    pages = urlset("https://x.example/a", "https://x.example/b")
    assert parse_sitemap(pages) == (["https://x.example/a", "https://x.example/b"], [])
    assert parse_sitemap(gzip.compress(pages)) == parse_sitemap(pages)
    assert parse_sitemap(sitemap_index("https://x.example/s.xml")) == (
        [],
        ["https://x.example/s.xml"],
    )
    assert parse_sitemap(b"https://x.example/a\nhttps://x.example/b\n")[0] == [
        "https://x.example/a",
        "https://x.example/b",
    ]
    bomb = (
        b'<?xml version="1.0"?><!DOCTYPE x [<!ENTITY a "aaaaaaaaaa">'
        b'<!ENTITY b "&a;&a;&a;&a;&a;&a;&a;&a;&a;&a;">]><urlset>&b;</urlset>'
    )
    for broken in (b"<html><body>Not found</body></html>", b"<urlset><url>", bomb):
        with pytest.raises(ValueError, match=r"."):
            parse_sitemap(broken)


def test_page_links_are_absolute_normalised_pages() -> None:
    html = (
        b'<html><head><base href="/shop/"></head><body>'
        b'<a href="shoes#top">Shoes</a> <a href="HTTP://X.example:80/a">A</a>'
        b'<a href="mailto:a@x.example">M</a> <a href="tel:123">T</a> <a href="javascript:x()">J</a>'
        b'<a href="/guide.PDF">G</a> <a href="shoes">again</a></body></html>'
    )
    assert page_links(html, "http://x.example/start") == [
        "http://x.example/shop/shoes",
        "http://x.example/a",
    ]


async def test_start_page_leaving_the_site_is_reported(
    aiohttp_server: AiohttpServer, elsewhere: Site, session: aiohttp.ClientSession
) -> None:
    site = Site()

    async def away(request: web.Request) -> web.Response:
        raise web.HTTPFound(elsewhere.url("/landing"))

    site.respond("/", away)
    await start(site, aiohttp_server)

    items = await collect(site.url("/"), session)

    assert len(items) == 1
    assert isinstance(items[0], ReadError)
    assert items[0].reason.startswith("start page skipped: redirect to ")
    assert elsewhere.requests == []


# --- private addresses ----------------------------------------------------------------


class _Names(AbstractResolver):
    """DNS for made-up host names, so a test can point one at any address."""

    def __init__(self, names: Mapping[str, str]) -> None:
        self._names = names

    async def resolve(
        self, host: str, port: int = 0, family: socket.AddressFamily = socket.AF_INET
    ) -> list[ResolveResult]:
        address = self._names[host]
        return [
            {
                "hostname": host,
                "host": address,
                "port": port,
                "family": socket.AF_INET6 if ":" in address else socket.AF_INET,
                "proto": 0,
                "flags": 0,
            }
        ]

    async def close(self) -> None:
        pass


@pytest.fixture
async def loopback_site(aiohttp_server: AiohttpServer) -> Site:
    site = Site()
    site.html("/", html_page("Home", prose("Internal admin")))
    return await start(site, aiohttp_server)


@pytest.mark.parametrize(
    "host", ["127.0.0.1", "localhost", "0.0.0.0", "[::1]", "[::ffff:127.0.0.1]", "127.0.0.2"]
)
async def test_a_private_address_is_refused_without_a_request(
    loopback_site: Site, host: str
) -> None:
    assert loopback_site.server is not None
    start_url = f"http://{host}:{loopback_site.server.port}/"

    async with crawler_session() as guarded:
        items = await collect(start_url, guarded)

    assert items == [ReadError(start_url, "refused: private address")]
    assert loopback_site.requests == []  # not even robots.txt


async def test_a_redirect_to_a_private_address_is_refused_at_connect(
    aiohttp_server: AiohttpServer,
) -> None:
    inside = Site()
    inside.html("/secret", html_page("Secret", prose("Staff passwords")))
    inside.server = await aiohttp_server(_app(inside), host="127.0.0.2")
    port = inside.server.port
    shop = Site()

    async def moved(request: web.Request) -> web.StreamResponse:
        # "www." counts as the same site, so only the address check stands in the way
        raise web.HTTPFound(f"http://www.shop.test:{port}/secret")

    shop.respond("/", moved)
    shop.server = await aiohttp_server(_app(shop), host="127.0.0.1", port=port)
    names = _Names({"shop.test": "127.0.0.1", "www.shop.test": "127.0.0.2"})

    async with crawler_session([ip_network("127.0.0.1/32")], resolver=names) as guarded:
        items = await collect(f"http://shop.test:{port}/", guarded)

    start_url = f"http://shop.test:{port}/"
    assert items == [ReadError(start_url, "refused: private address", start_url)]
    assert shop.requests == ["/robots.txt", "/sitemap.xml", "/"]
    assert inside.requests == []


async def test_a_host_name_resolving_to_a_private_address_is_refused(
    loopback_site: Site,
) -> None:
    assert loopback_site.server is not None
    start_url = f"http://shop.test:{loopback_site.server.port}/"

    async with crawler_session(resolver=_Names({"shop.test": "127.0.0.1"})) as guarded:
        items = await collect(start_url, guarded)

    assert items == [ReadError(start_url, "refused: private address")]
    assert loopback_site.requests == []


async def test_an_allowed_network_is_crawled(loopback_site: Site) -> None:
    assert loopback_site.server is not None
    async with crawler_session([ip_network("127.0.0.1/32")]) as guarded:
        items = await collect(loopback_site.url("/"), guarded)
    assert len([item for item in items if isinstance(item, Document)]) == 1


async def test_a_plain_session_is_not_accepted() -> None:
    async with aiohttp.ClientSession() as plain:
        with pytest.raises(TypeError):
            await collect("http://shop.example/", plain)
