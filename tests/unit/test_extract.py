"""HTML pages into Documents: main text, title, canonical URL, product data, locale, safety."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.knowledge.extract import extract_page, normalise_url, same_host

NAV = "Home Shop all sneakers Outlet deals Our story Store locator"
COOKIES = "We use cookies to give you the best experience. Accept all cookies or manage settings"
FOOTER = "Acme Running B.V. Chamber of Commerce 12345678 All rights reserved"

SHIPPING_PAGE = f"""<!doctype html>
<html lang="en-GB">
<head>
  <meta charset="utf-8">
  <title>Shipping and delivery | Acme Running</title>
  <meta name="description" content="When your order arrives and what shipping costs.">
  <meta property="og:title" content="Shipping at Acme">
  <link rel="canonical" href="/en/shipping">
  <script>window.dataLayer = [];</script>
</head>
<body>
  <div id="cookie-banner" class="cookie-consent">
    <p>{COOKIES}</p>
    <button>Accept all</button>
  </div>
  <header class="site-header">
    <a href="/" class="logo">Acme Running</a>
    <nav class="main-nav">
      <ul>
        <li><a href="/">Home</a></li><li><a href="/shop">Shop all sneakers</a></li>
        <li><a href="/outlet">Outlet deals</a></li><li><a href="/story">Our story</a></li>
        <li><a href="/stores">Store locator</a></li>
      </ul>
    </nav>
  </header>
  <main>
    <article>
      <h1>Shipping and delivery</h1>
      <p>We ship every order from our warehouse in Utrecht. Orders placed before 22:00 on a
      working day are delivered the next working day in the Netherlands and Belgium.</p>
      <h2>Shipping costs</h2>
      <p>Shipping is free for orders over 50 euros. Below that amount we charge a flat fee
      that depends on the country you ship to.</p>
      <table>
        <thead><tr><th>Country</th><th>Cost</th><th>Delivery time</th></tr></thead>
        <tbody>
          <tr><td>Netherlands</td><td>€4.95</td><td>1 working day</td></tr>
          <tr><td>Germany</td><td>€6.95</td><td>2-3 working days</td></tr>
          <tr><td>France</td><td>€8.95</td><td>3-4 working days</td></tr>
        </tbody>
      </table>
      <h2>Tracking your parcel</h2>
      <p>As soon as your parcel leaves our warehouse you receive an e-mail with a track and
      trace code from the carrier, so you can follow it all the way to your door.</p>
    </article>
  </main>
  <footer class="site-footer">
    <p>{FOOTER}</p>
    <ul><li><a href="/privacy">Privacy policy</a></li><li><a href="/terms">Terms</a></li></ul>
  </footer>
</body>
</html>
"""


def page(
    body: str = "<p>Plain content.</p>",
    *,
    head: str = "",
    lang: str | None = None,
    json_ld: Any = None,
) -> str:
    lang_attribute = f' lang="{lang}"' if lang else ""
    script = f'<script type="application/ld+json">{json.dumps(json_ld)}</script>' if json_ld else ""
    return (
        f"<!doctype html><html{lang_attribute}><head>{head}{script}</head>"
        f"<body><main><article>{body}</article></main></body></html>"
    )


LONG_DUTCH = (
    "<h1>Retourneren</h1><p>Je kunt je bestelling binnen dertig dagen gratis retourneren. "
    "Meld je retour aan via je account en stuur het pakket terug met het retourlabel dat je "
    "van ons per e-mail ontvangt. Zodra wij het pakket hebben ontvangen, betalen wij het "
    "aankoopbedrag binnen vijf werkdagen terug op de rekening waarmee je hebt betaald.</p>"
)


def test_main_text_keeps_headings_and_table_and_drops_boilerplate() -> None:
    doc = extract_page(SHIPPING_PAGE, "https://shop.example/en/shipping?ref=nav")

    lines = doc.text.splitlines()
    assert "# Shipping and delivery" in lines
    assert "## Shipping costs" in lines
    assert "## Tracking your parcel" in lines
    assert "Orders placed before 22:00" in doc.text
    assert any(
        "Germany" in line and "€6.95" in line and "2-3 working days" in line for line in lines
    )
    for boilerplate in ("Shop all sneakers", "Store locator", "cookies", "Chamber of Commerce"):
        assert boilerplate not in doc.text
    assert "dataLayer" not in doc.text


def test_page_facts() -> None:
    doc = extract_page(
        SHIPPING_PAGE.encode(),
        "https://shop.example/en/shipping?ref=nav",
        headers={"ETag": '"v1"', "Last-Modified": "Wed, 21 Oct 2025 07:28:00 GMT"},
    )

    assert doc.title == "Shipping and delivery | Acme Running"
    assert doc.url == "https://shop.example/en/shipping"
    assert doc.locale == "en"  # the URL folder wins over <html lang="en-GB">
    assert doc.page_type == "policy"
    assert doc.product is None
    assert doc.etag == '"v1"'
    assert doc.last_modified == "Wed, 21 Oct 2025 07:28:00 GMT"
    assert doc.meta["description"] == "When your order arrives and what shipping costs."


def test_title_falls_back_to_og_title_then_h1() -> None:
    og = page(LONG_DUTCH, head='<meta property="og:title" content="Retour | Acme">')
    assert extract_page(og, "https://shop.example/retour").title == "Retour | Acme"
    assert extract_page(page(LONG_DUTCH), "https://shop.example/retour").title == "Retourneren"


@pytest.mark.parametrize(
    ("href", "expected"),
    [
        ("/nl/retourneren", "https://shop.example/nl/retourneren"),
        ("https://www.shop.example/nl/retourneren#top", "https://www.shop.example/nl/retourneren"),
        ("https://SHOP.example:443/nl/retour", "https://shop.example/nl/retour"),
        ("https://other.example/nl/retourneren", "https://shop.example/p?id=7"),
        ("http://shop.example:8080/nl/retourneren", "https://shop.example/p?id=7"),
    ],
)
def test_canonical_only_on_the_same_host(href: str, expected: str) -> None:
    html = page(LONG_DUTCH, head=f'<link rel="canonical" href="{href}">')
    assert extract_page(html, "https://shop.example/p?id=7").url == expected


@pytest.mark.parametrize(
    ("href", "expected"),
    [
        ("/nl/retourneren.html", "/nl/retourneren.html"),  # itself, as most pages say
        ("retourneren.html#top", "/nl/retourneren.html"),
        ("/nl/retour.html", "/nl/retour.html"),
    ],
)
def test_a_local_file_follows_its_canonical_path_quietly(
    href: str, expected: str, caplog: pytest.LogCaptureFixture
) -> None:
    # Files of a local folder are cited by their path: their canonical path is on their site.
    html = page(LONG_DUTCH, head=f'<link rel="canonical" href="{href}">')
    with caplog.at_level("INFO", logger="core.knowledge.extract"):
        assert extract_page(html, "/nl/retourneren.html").url == expected
    assert "extract.canonical.refused" not in caplog.text


def test_a_local_file_keeps_its_path_against_a_canonical_on_some_host(
    caplog: pytest.LogCaptureFixture,
) -> None:
    html = page(LONG_DUTCH, head='<link rel="canonical" href="https://other.example/x">')
    with caplog.at_level("INFO", logger="core.knowledge.extract"):
        assert extract_page(html, "/nl/retourneren.html").url == "/nl/retourneren.html"
    assert "extract.canonical.refused" in caplog.text


PRODUCT = {
    "@type": "Product",
    "name": "Trail Runner 2",
    "sku": "TR-2-BLK",
    "offers": {
        "@type": "Offer",
        "price": "129.95",
        "priceCurrency": "EUR",
        "availability": "https://schema.org/InStock",
    },
}


@pytest.mark.parametrize(
    "json_ld",
    [
        {"@context": "https://schema.org", **PRODUCT},
        {
            "@context": "https://schema.org",
            "@graph": [
                {"@type": "WebPage", "name": "Trail Runner 2 | Acme"},
                {"@type": "BreadcrumbList", "itemListElement": []},
                {**PRODUCT, "offers": [{"@type": "Offer", "url": "/x"}, PRODUCT["offers"]]},
            ],
        },
        [{"@type": "Organization", "name": "Acme"}, PRODUCT],
    ],
    ids=["plain", "graph-with-offer-list", "top-level-list"],
)
def test_json_ld_product(json_ld: Any) -> None:
    body = "<h1>Trail Runner 2</h1><p>A light trail shoe with a grippy sole for muddy paths.</p>"
    doc = extract_page(page(body, json_ld=json_ld), "https://shop.example/p/trail-runner-2")

    assert doc.product == {
        "name": "Trail Runner 2",
        "sku": "TR-2-BLK",
        "price": "129.95",
        "currency": "EUR",
        "availability": "InStock",
    }
    assert doc.page_type == "product"
    assert doc.text.splitlines()[-1] == (
        "Product: Trail Runner 2 · SKU: TR-2-BLK · Price: 129.95 EUR · Availability: InStock"
    )


def test_json_ld_number_price_and_aggregate_offer() -> None:
    json_ld = {
        "@type": ["Product", "Thing"],
        "name": "Socks",
        "offers": {"@type": "AggregateOffer", "lowPrice": 9.0, "priceCurrency": "EUR"},
    }
    doc = extract_page(page(LONG_DUTCH, json_ld=json_ld), "https://shop.example/p/socks")
    assert doc.product == {"name": "Socks", "price": "9", "currency": "EUR"}


def test_broken_json_ld_is_ignored() -> None:
    html = page(LONG_DUTCH).replace(
        "</head>", '<script type="application/ld+json">{"@type": "Product", </script></head>'
    )
    doc = extract_page(html, "https://shop.example/retourneren")
    assert doc.product is None
    assert doc.page_type == "policy"


def test_locale_precedence() -> None:
    assert extract_page(page(LONG_DUTCH, lang="de-DE"), "https://x.example/fr/a").locale == "fr"
    assert extract_page(page(LONG_DUTCH, lang="de_DE"), "https://x.example/a").locale == "de-de"
    assert extract_page(page(LONG_DUTCH), "https://x.example/a").locale == "nl"
    assert extract_page(page(LONG_DUTCH, lang="x-default"), "https://x.example/a").locale == "nl"


def test_short_page_falls_back_to_plain_extraction() -> None:
    html = (
        "<html><head><title>Contact</title></head><body>"
        "<nav><a href='/'>Home</a> <a href='/shop'>Shop</a></nav>"
        "<h1>Contact</h1><p>Call us on 020 123 4567.</p>"
        "<footer>Copyright Acme</footer></body></html>"
    )
    doc = extract_page(html, "https://shop.example/contact")
    assert "Call us on 020 123 4567." in doc.text
    assert "Home" not in doc.text
    assert "Copyright" not in doc.text
    assert doc.page_type == "contact"


@pytest.mark.parametrize(
    ("html", "expected"),
    [
        ("<p>Short text here, about shipping.</p>", "Short text here, about shipping."),
        (
            "<html><body><nav><a href='/'>Home</a> <a href='/blog'>Blog</a></nav><main>"
            "<h1>Payment methods</h1><ul><li>iDEAL</li><li>PayPal</li></ul></main></body></html>",
            "# Payment methods",
        ),
    ],
)
def test_short_pages_keep_their_content(html: str, expected: str) -> None:
    doc = extract_page(html, "https://shop.example/info")
    assert expected in doc.text
    assert "Blog" not in doc.text


def test_bytes_are_decoded_with_the_declared_charset() -> None:
    html = page("<h1>Rücksendung</h1><p>Größe tauschen ist kostenlos möglich.</p>")
    doc = extract_page(
        html.encode("latin-1"),
        "https://shop.example/de/ruecksendung",
        headers={"content-type": "text/html; charset=ISO-8859-1"},
    )
    assert "Größe tauschen" in doc.text


@pytest.mark.parametrize(
    "html",
    [
        "",
        b"",
        "   ",
        "<<<>>>",
        "<html><body><div><p>Unclosed <b>tags</div></span></html",
        '<?xml version="1.0" encoding="utf-8"?><html><body><p>XHTML page</p></body></html>',
        b"\xff\xfe\x00\x00garbage\x00",
        "\x00\x01\x02",
        "<html>" + "<div>" * 5000 + "deep" + "</div>" * 5000 + "</html>",
    ],
)
def test_malformed_html_does_not_raise(html: str | bytes) -> None:
    doc = extract_page(html, "https://shop.example/broken", headers={"ETag": '"x"'})
    assert doc.url == "https://shop.example/broken"
    assert "\x00" not in doc.text
    assert doc.etag == '"x"'


def test_url_helpers() -> None:
    assert normalise_url("HTTPS://Shop.Example:443/a?b=1#frag") == "https://shop.example/a?b=1"
    assert normalise_url("http://shop.example:80") == "http://shop.example/"
    assert normalise_url("http://shop.example:8080/x") == "http://shop.example:8080/x"
    assert same_host("http://shop.example/a", "https://www.shop.example/b")
    assert not same_host("http://127.0.0.1:8080/", "http://127.0.0.1:8081/")
    assert not same_host("https://shop.example/", "https://evil.example/")
    assert not same_host("mailto:info@shop.example", "https://shop.example/")
    assert same_host("/en/shipping.html", "/en/shipping.html")  # a local folder's pages
    assert same_host("/en/shipping.html", "/nl/verzending.html?x=1")
    assert not same_host("/en/shipping.html", "https://shop.example/en/shipping.html")
    assert not same_host("/en/shipping.html", "//evil.example/en/shipping.html")
