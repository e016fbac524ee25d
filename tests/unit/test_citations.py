"""Cited sources after a messaging reply: numbering, links, language, limits, Telegram HTML."""

from __future__ import annotations

import html
import re
from dataclasses import dataclass

import pytest

from channels.citations import (
    ReplyParts,
    link_url,
    reply_parts,
    sources_heading,
    telegram_html,
)
from channels.delivery import split_message

SITE = "https://shop.example"


@dataclass(frozen=True)
class Source:
    id: int
    url: str
    title: str


SHIPPING = Source(1, "/en/shipping.html", "Shipping")
RETURNS = Source(2, "https://shop.example/en/returns.html", "Returns & refunds")


def shown_by_telegram(message: str) -> str:
    """What a Telegram user reads of an HTML message: tags gone, entities decoded."""
    return html.unescape(re.sub(r"<[^<>]*>", "", message))


# -- the list -----------------------------------------------------------------------------


def test_the_sources_follow_the_answer_numbered_as_it_cites_them() -> None:
    parts = reply_parts(
        "Orders arrive in 2-3 days [1]. Returns are free [2].",
        1600,
        [RETURNS, SHIPPING],
        language="en",
        site=SITE,
    )

    assert parts == [
        "Orders arrive in 2-3 days [1]. Returns are free [2].\n\n"
        "Sources:\n"
        "[1] Shipping – https://shop.example/en/shipping.html\n"
        "[2] Returns & refunds – https://shop.example/en/returns.html"
    ]


@pytest.mark.parametrize(
    ("language", "heading"),
    [
        ("en", "Sources"),
        ("nl", "Bronnen"),
        ("de", "Quellen"),
        ("fr", "Sources"),
        ("es", "Fuentes"),
        ("it", "Fonti"),
        ("de-CH", "Quellen"),
        ("pt_BR", "Fontes"),
        ("xx", "Sources"),
        (None, "Sources"),
    ],
)
def test_the_heading_is_in_the_replys_language(language: str | None, heading: str) -> None:
    assert sources_heading(language) == heading
    [part] = reply_parts("Gratis [1].", 1600, [SHIPPING], language=language, site=SITE)
    assert part.split("\n")[2] == f"{heading}:"


def test_without_sources_the_reply_is_only_split() -> None:
    text = "Ask me anything. " * 200
    assert reply_parts(text, 1600) == split_message(text, 1600)
    assert ReplyParts(1600)(text) == split_message(text, 1600)


@pytest.mark.parametrize(
    ("url", "site", "expected"),
    [
        ("/en/shipping.html", SITE, "https://shop.example/en/shipping.html"),
        ("/en/shipping.html", SITE + "/", "https://shop.example/en/shipping.html"),
        ("en/shipping.html", SITE, "https://shop.example/en/shipping.html"),
        ("https://other.example/a?b=1&c=2#d", SITE, "https://other.example/a?b=1&c=2#d"),
        ("/en/size guide.html", SITE, "https://shop.example/en/size%20guide.html"),
        ("/fr/livraison-été", SITE, "https://shop.example/fr/livraison-%C3%A9t%C3%A9"),
        ('/x"><b>', SITE, "https://shop.example/x%22%3E%3Cb%3E"),
        ("/en/shipping.html", None, None),
        ("javascript:alert(1)", SITE, None),
        ("mailto:hello@shop.example", SITE, None),
        ("", SITE, None),
    ],
)
def test_source_urls_become_absolute_links(url: str, site: str | None, expected: str) -> None:
    assert link_url(url, site) == expected


def test_a_source_that_cannot_be_linked_is_listed_by_title() -> None:
    [part] = reply_parts("Free [1]. Fast [2].", 1600, [SHIPPING, RETURNS], site=None)
    assert part.endswith(
        "\n\nSources:\n[1] Shipping\n[2] Returns & refunds – https://shop.example/en/returns.html"
    )


def test_long_titles_are_shortened_and_a_missing_title_shows_the_url() -> None:
    long = Source(
        1, "/a", "The complete guide to   returning\nshoes, boots and sandals bought online"
    )
    untitled = Source(2, "/b", "")
    [part] = reply_parts("Yes [1][2].", 1600, [long, untitled], site=SITE)
    lines = part.split("\n")[3:]
    assert lines == [
        "[1] The complete guide to returning shoes, boots and sandals… – https://shop.example/a",
        "[2] https://shop.example/b",
    ]


# -- the limit ----------------------------------------------------------------------------


def test_the_list_gets_its_own_message_when_the_last_part_is_full() -> None:
    text = ("Our boots are made by hand in Portugal from full-grain leather. " * 25).strip()
    parts = reply_parts(text, 1600, [SHIPPING, RETURNS], site=SITE)

    assert parts[:-1] == [text]
    assert parts[-1] == (
        "Sources:\n"
        "[1] Shipping – https://shop.example/en/shipping.html\n"
        "[2] Returns & refunds – https://shop.example/en/returns.html"
    )
    assert all(len(p) <= 1600 for p in parts)


def test_the_list_goes_into_the_last_part_when_it_fits() -> None:
    text = "\n\n".join(["x" * 700, "y" * 700, "z" * 400])
    parts = reply_parts(text, 1600, [SHIPPING], site=SITE)
    assert len(parts) == 2
    assert parts[1].startswith("z" * 400 + "\n\nSources:\n[1] Shipping")
    assert all(len(p) <= 1600 for p in parts)


def test_a_list_longer_than_a_message_is_split_between_links_not_inside_one() -> None:
    sources = [Source(n, f"/p/{n}?ref=" + "q" * 300, f"Page {n}") for n in range(1, 6)]
    parts = reply_parts("Everything [1][2][3][4][5].", 1000, sources, site=SITE)

    assert len(parts) >= 3
    assert all(len(p) <= 1000 for p in parts)
    listed = [line for p in parts for line in p.split("\n") if line.startswith("[")]
    assert [line.split("]")[0] for line in listed] == [f"[{n}" for n in range(1, 6)]
    for line in listed:
        assert line.endswith("q" * 300)  # every link whole
    assert all(p.split("\n\n")[-1].startswith("Sources:\n") for p in parts)


def test_a_link_too_long_for_any_message_is_listed_by_title() -> None:
    huge = Source(1, "/p?" + "q" * 2000, "Catalogue")
    [part] = reply_parts("See the catalogue [1].", 1600, [huge], site=SITE)
    assert part == "See the catalogue [1].\n\nSources:\n[1] Catalogue"


@pytest.mark.parametrize("limit", [120, 300, 1600, 4096])
def test_every_part_stays_within_the_limit(limit: int) -> None:
    text = "Refunds <within 30 days> & exchanges. " * 90
    sources = [Source(n, f"/en/page-{n}.html", f"Page number {n} " * 4) for n in range(1, 6)]
    parts = reply_parts(text, limit, sources, language="nl", site=SITE)
    assert all(0 < len(p) <= limit for p in parts)
    for part in parts:
        assert len(shown_by_telegram(telegram_html(part))) <= len(part)
    assert "Bronnen:" in parts[-1]


# -- Telegram ------------------------------------------------------------------------------


def test_telegram_shows_the_titles_as_links_and_escapes_the_answer() -> None:
    [part] = reply_parts("Sizes <38> & up [1]. Returns [2].", 4096, [SHIPPING, RETURNS], site=SITE)

    message = telegram_html(part)

    assert message == (
        "Sizes &lt;38&gt; &amp; up [1]. Returns [2].\n\n"
        "Sources:\n"
        '[1] <a href="https://shop.example/en/shipping.html">Shipping</a>\n'
        '[2] <a href="https://shop.example/en/returns.html">Returns &amp; refunds</a>'
    )
    assert shown_by_telegram(message) == (
        "Sizes <38> & up [1]. Returns [2].\n\nSources:\n[1] Shipping\n[2] Returns & refunds"
    )


def test_telegram_link_addresses_are_escaped_as_attributes() -> None:
    source = Source(1, "/search?q=boots&size=42'", "Search")
    [part] = reply_parts("Here [1].", 4096, [source], site=SITE)
    assert telegram_html(part).endswith(
        '[1] <a href="https://shop.example/search?q=boots&amp;size=42&#x27;">Search</a>'
    )


def test_telegram_links_a_source_listed_by_url_and_leaves_one_without() -> None:
    part = reply_parts(
        "A [1]. B [2].", 4096, [Source(1, "/a", ""), Source(2, "/b", "B")], site=None
    )
    part_with_site = reply_parts("A [1].", 4096, [Source(1, "/a", "")], site=SITE)[0]
    assert telegram_html(part[0]).endswith("Sources:\n[2] B")
    assert telegram_html(part_with_site).endswith(
        '[1] <a href="https://shop.example/a">https://shop.example/a</a>'
    )


@pytest.mark.parametrize(
    "text",
    [
        "Use <b>bold</b> & 5 > 3, not &amp; or <script>",
        "Sources:\n[1] Shipping – https://shop.example/a\nand then more text",
        "Note\n\nSource list:\n[1] Shipping – https://shop.example/a",
        "Done.\n\nSources:\n[1] Shipping – javascript:alert(1)",
        "Done.\n\nSources:",
    ],
)
def test_text_that_is_not_our_list_is_only_escaped(text: str) -> None:
    message = telegram_html(text)
    assert "<a " not in message
    assert message == html.escape(text, quote=False)


def test_a_part_that_is_only_the_list_is_linked() -> None:
    text = "x" * 4090
    parts = reply_parts(text, 4096, [SHIPPING], language="de", site=SITE)
    assert parts[-1].startswith("Quellen:\n")
    assert telegram_html(parts[-1]) == (
        'Quellen:\n[1] <a href="https://shop.example/en/shipping.html">Shipping</a>'
    )
