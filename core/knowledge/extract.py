"""Turns one fetched HTML page into a `Document`: main text, title, canonical URL, product facts."""

from __future__ import annotations

import copy
import json
import logging
import re
from collections import deque
from collections.abc import Iterator, Mapping
from typing import Any
from urllib.parse import urljoin, urlsplit, urlunsplit

import lxml.html  # type: ignore[import-untyped]
import trafilatura
from lxml.etree import LxmlError  # type: ignore[import-untyped]
from trafilatura.utils import decode_file

from core.documents import Document
from core.knowledge.classify import infer_page_type
from core.locale import resolve_locale

log = logging.getLogger(__name__)

_DEFAULT_PORTS = {"http": 80, "https": 443}
_XML_DECLARATION = re.compile(r"^\s*<\?xml[^>]*\?>", re.IGNORECASE)
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
_CHARSET = re.compile(r"charset\s*=\s*[\"']?([\w.:-]+)", re.IGNORECASE)

# Used only when trafilatura finds no main content (very short pages).
_BOILERPLATE_TAGS = (
    "script", "style", "noscript", "template", "nav", "header", "footer", "aside", "form",
    "iframe", "svg", "button", "select", "dialog",
)  # fmt: skip
_BOILERPLATE_ATTR = re.compile(
    r"cookie|consent|gdpr|newsletter|popup|modal|navbar|breadcrumb", re.I
)
_HEADINGS = ("h1", "h2", "h3", "h4", "h5", "h6")
_BLOCKS = frozenset(
    (*_HEADINGS, "p", "li", "dt", "dd", "blockquote", "pre", "tr", "caption", "figcaption")
)

# Below this many characters trafilatura distrusts its own result (its MIN_EXTRACTED_SIZE).
SHORT_TEXT = 250

_PRODUCT_TYPES = frozenset({"Product", "ProductGroup", "IndividualProduct", "ProductModel"})


def normalise_url(url: str) -> str:
    """The form we key pages by: lowercase scheme and host, no default port, no fragment."""
    parts = urlsplit(url.strip())
    scheme = parts.scheme.lower()
    host = (parts.hostname or "").lower()
    if ":" in host:
        host = f"[{host}]"
    try:
        port = parts.port
    except ValueError:
        port = None
    netloc = host if port is None or port == _DEFAULT_PORTS.get(scheme) else f"{host}:{port}"
    if parts.username:
        netloc = f"{parts.username}@{netloc}"
    return urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))


def _site_of(url: str) -> tuple[str, int | None] | None:
    parts = urlsplit(url)
    if parts.scheme not in _DEFAULT_PORTS or not parts.hostname:
        return None
    host = parts.hostname.lower().removeprefix("www.")
    try:
        port = parts.port
    except ValueError:
        return None
    # http and https on their default ports are one site (http -> https redirects)
    return host, None if port in (None, _DEFAULT_PORTS[parts.scheme]) else port


def _is_path(url: str) -> bool:
    parts = urlsplit(url)
    return not parts.scheme and not parts.netloc


def same_host(url: str, other: str) -> bool:
    """Whether two URLs are on one site: http(s) URLs with the same host (with or without
    "www.") and port, or two addresses without a host (the pages of a local folder, cited
    by their path, are one site)."""
    if _is_path(url) and _is_path(other):
        return True
    site = _site_of(url)
    return site is not None and site == _site_of(other)


def _decode(html: str | bytes, headers: Mapping[str, str]) -> str:
    if isinstance(html, str):
        return html
    charset = _CHARSET.search(headers.get("content-type", ""))
    if charset:
        try:
            return html.decode(charset.group(1))
        except (LookupError, UnicodeDecodeError):
            pass  # a wrong header is common; let detection have a go
    return decode_file(html)


def _parse(html: str) -> Any:
    try:
        return lxml.html.document_fromstring(_XML_DECLARATION.sub("", html, count=1))
    except (LxmlError, ValueError):
        return None


def _squash(text: str | None) -> str:
    return " ".join((text or "").split())


def _first(tree: Any, xpath: str) -> str:
    for value in tree.xpath(xpath):
        text = _squash(value if isinstance(value, str) else value.text_content())
        if text:
            return text
    return ""


def _lower(attribute: str) -> str:
    """XPath for a lowercased attribute (XPath 1.0 has no lower-case())."""
    return f'translate({attribute}, "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")'


def _meta(tree: Any, *names: str) -> str:
    for name in names:
        xpath = f'//meta[{_lower("@name")}="{name}" or @property="{name}"]/@content'
        if value := _first(tree, xpath):
            return value
    return ""


def _title(tree: Any) -> str:
    return _first(tree, "//title") or _meta(tree, "og:title") or _first(tree, "//h1")


def _declared_language(tree: Any) -> str | None:
    return (
        _first(tree, "/html/@lang | /html/@xml:lang")
        or _first(tree, f'//meta[{_lower("@http-equiv")}="content-language"]/@content')
        or _meta(tree, "og:locale")
        or None
    )


def _canonical(tree: Any, url: str) -> str:
    for link in tree.xpath("//link[@rel][@href]"):
        if "canonical" not in link.get("rel", "").lower().split():
            continue
        target = urljoin(url, link.get("href", "").strip())
        if same_host(target, url):
            return normalise_url(target)
        log.info("extract.canonical.refused url=%s canonical=%s", url, target)
        return url
    return url


def _json_ld(tree: Any) -> Iterator[Any]:
    for script in tree.xpath('//script[@type="application/ld+json"]'):
        raw = (script.text or "").strip().removeprefix("<!--").removesuffix("-->").strip()
        try:
            yield json.loads(raw.rstrip(";"), strict=False)
        except ValueError:
            log.info("extract.json_ld.invalid chars=%d", len(raw))


def _nodes(data: Any) -> Iterator[dict[str, Any]]:
    """Every JSON-LD object, top-level ones first (``@graph``, lists and nesting included)."""
    queue: deque[Any] = deque([data])
    while queue:
        item = queue.popleft()
        if isinstance(item, list):
            queue.extend(item)
        elif isinstance(item, dict):
            yield item
            queue.extend(v for v in item.values() if isinstance(v, dict | list))


def _short_type(value: Any) -> str:
    """ "https://schema.org/InStock" -> "InStock"; "schema:Product" -> "Product"."""
    return re.split(r"[/:#]", str(value).strip())[-1]


def _is_product(node: Mapping[str, Any]) -> bool:
    types = node.get("@type")
    names = types if isinstance(types, list) else [types]
    return any(_short_type(t) in _PRODUCT_TYPES for t in names if t)


def _text(value: Any) -> str | None:
    if isinstance(value, dict):
        value = value.get("name") or value.get("@value")
    if isinstance(value, list):
        value = value[0] if value else None
    if isinstance(value, bool) or value is None:
        return None
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    text = _squash(str(value))
    return text or None


def _offer(offers: Any) -> dict[str, Any]:
    """The first offer that has a price: a plain or aggregate offer, or a price specification."""
    candidates = offers if isinstance(offers, list) else [offers]
    for offer in candidates:
        if not isinstance(offer, dict):
            continue
        spec = offer.get("priceSpecification")
        spec = (spec[0] if spec else {}) if isinstance(spec, list) else spec
        spec = spec if isinstance(spec, dict) else {}
        prices = (offer.get("price"), offer.get("lowPrice"), spec.get("price"))
        price = next((p for p in map(_text, prices) if p is not None), None)
        if price is not None:
            return {
                "price": price,
                "currency": _text(offer.get("priceCurrency") or spec.get("priceCurrency")),
                "availability": _text(offer.get("availability")),
            }
    return {}


def _product(tree: Any) -> dict[str, Any] | None:
    for data in _json_ld(tree):
        for node in _nodes(data):
            if not _is_product(node):
                continue
            offer = _offer(node.get("offers"))
            facts = {
                "name": _text(node.get("name")),
                "sku": _text(node.get("sku")),
                "price": offer.get("price"),
                "currency": offer.get("currency"),
                "availability": offer.get("availability"),
            }
            if facts["availability"]:
                facts["availability"] = _short_type(facts["availability"])
            return {key: value for key, value in facts.items() if value} or None
    return None


def product_line(product: Mapping[str, Any]) -> str:
    """The product facts as one searchable line ("Product: X · SKU: Y · Price: 10 EUR ...")."""
    parts = []
    if product.get("name"):
        parts.append(f"Product: {product['name']}")
    if product.get("sku"):
        parts.append(f"SKU: {product['sku']}")
    if product.get("price"):
        parts.append(f"Price: {product['price']} {product.get('currency', '')}".rstrip())
    if product.get("availability"):
        parts.append(f"Availability: {product['availability']}")
    return " · ".join(parts)


def _clean(text: str) -> str:
    """Without control characters (PostgreSQL refuses NUL) or trailing spaces on lines."""
    text = _CONTROL.sub("", text)
    return "\n".join(line.rstrip() for line in text.splitlines()).strip()


def _trafilatura(html: str, url: str, *, favor_precision: bool = False) -> str:
    text = trafilatura.extract(
        html,
        url=url,
        output_format="markdown",
        include_comments=False,
        include_tables=True,
        include_links=False,
        include_images=False,
        favor_precision=favor_precision,
    )
    return _clean(text or "")


def _terms_as_items(tree: Any) -> str | None:
    """The page with each definition list's term and description on one line ("Price:
    €169.95"), or None when it has none. Extractors otherwise give the term and its value as
    separate lines, and a value alone ("€169.95") says nothing about what it is."""
    if not tree.xpath("//dl"):
        return None
    tree = copy.deepcopy(tree)
    for dl in tree.xpath("//dl"):
        items = []
        term: str | None = None
        for child in dl.iterchildren("dt", "dd", "div"):
            pairs = child.iterchildren("dt", "dd") if child.tag == "div" else [child]
            for element in pairs:
                text = _squash(element.text_content())
                if element.tag == "dt":
                    term = text
                elif text:
                    items.append(f"{term.rstrip(':')}: {text}" if term else text)
        ul = lxml.html.Element("ul")
        for item in items:
            li = lxml.html.Element("li")
            li.text = item
            ul.append(li)
        ul.tail = dl.tail
        dl.getparent().replace(dl, ul)
    return str(lxml.html.tostring(tree, encoding="unicode"))


def _main_text(html: str, url: str, tree: Any) -> str:
    html = _terms_as_items(tree) or html
    text = _trafilatura(html, url)
    if len(text) >= SHORT_TEXT:
        return text
    # On short pages trafilatura falls back to a baseline that keeps menus ("Home Shop ...");
    # its precision mode does not, and our plain reading catches what both miss.
    return _trafilatura(html, url, favor_precision=True) or _clean(_plain_text(tree))


def _is_boilerplate(element: Any) -> bool:
    names = f"{element.get('id', '')} {element.get('class', '')}"
    return bool(_BOILERPLATE_ATTR.search(names))


def _block_text(element: Any) -> str:
    if element.tag == "tr":
        cells = [_squash(cell.text_content()) for cell in element.xpath("./th | ./td")]
        return f"| {' | '.join(cells)} |" if any(cells) else ""
    text = _squash(element.text_content())
    if text and element.tag in _HEADINGS:
        return f"{'#' * int(element.tag[1])} {text}"
    return text


def _is_outer_block(element: Any) -> bool:
    """A block not inside another one; a <div> only when it holds no blocks of its own."""
    if any(ancestor.tag in _BLOCKS for ancestor in element.iterancestors()):
        return False
    if element.tag != "div":
        return True
    return not any(d.tag in _BLOCKS or d.tag == "div" for d in element.iterdescendants())


def _plain_text(tree: Any) -> str:
    """Headings, paragraphs, list items and table rows of the body, boilerplate removed."""
    body = tree.find("body")
    body = copy.deepcopy(body if body is not None else tree)
    doomed = list(body.iter(*_BOILERPLATE_TAGS))
    doomed += [el for el in body.iterdescendants() if _is_boilerplate(el)]
    for element in doomed:
        if element.getparent() is not None:
            element.drop_tree()
    lines = [_block_text(el) for el in body.iter(*_BLOCKS, "div") if _is_outer_block(el)]
    lines = [line for line in lines if line] or [_squash(body.text_content())]
    return "\n\n".join(line for line in lines if line)


def _empty(url: str, headers: Mapping[str, str]) -> Document:
    return Document(
        url=url,
        title="",
        text="",
        etag=headers.get("etag") or None,
        last_modified=headers.get("last-modified") or None,
    )


def extract_page(
    html: str | bytes, url: str, *, headers: Mapping[str, str] | None = None
) -> Document:
    """One HTML page as a `Document`; never raises (a page we cannot read has empty text)."""
    lowered = {k.lower(): v for k, v in (headers or {}).items()}
    try:
        return _extract(_decode(html, lowered), url, lowered)
    except Exception as exc:  # a broken page must not end an ingest; the caller sees no text
        log.warning("extract.page.failed url=%s error=%r", url, exc)
        return _empty(url, lowered)


def _extract(html: str, url: str, headers: Mapping[str, str]) -> Document:
    tree = _parse(html)
    if tree is None:
        log.info("extract.page.empty url=%s", url)
        return _empty(url, headers)
    main = _main_text(html, url, tree)
    product = _product(tree)
    # the facts go into the text so that a search for a SKU or a price finds the page
    text = f"{main}\n\n{product_line(product)}".strip() if product else main
    title = _clean(_title(tree))
    description = _meta(tree, "description", "og:description")
    return Document(
        url=_canonical(tree, url),
        title=title,
        text=text,
        locale=resolve_locale(url, _declared_language(tree), main),
        page_type=infer_page_type(url, title, product),
        product=product,
        etag=headers.get("etag") or None,
        last_modified=headers.get("last-modified") or None,
        meta={"description": description} if description else {},
    )
