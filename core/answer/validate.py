"""Deterministic checks of a written answer against its sources: citations, links, phone
numbers, e-mail addresses and hosts, Markdown and copied markup. Each failure is a reason the
model can read and act on."""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from urllib.parse import unquote, urljoin, urlsplit

from markdown_it import MarkdownIt
from markdown_it.token import Token

from core.answer.contacts import (
    EMAIL,
    bare_hosts,
    email_addresses,
    number_runs,
    phone_numbers,
    registered_domain,
    same_digits,
    same_number,
)
from core.answer.postprocess import PROMPT_TAGS

# CommonMark with raw HTML recognised as such (so it can be found), plus what the widget
# renders besides: tables and strike-through.
_MARKDOWN = MarkdownIt("commonmark", {"html": True}).enable(["table", "strikethrough"])

# A citation as the prompt asks for it; "[1](...)" is a link, not a citation.
_CITATION = re.compile(r"\[\s*(\d+)\s*\](?!\()")
# Bare addresses in running text (links and autolinks are read from the parse).
_BARE_URL = re.compile(r"(?<![\w@/])(?:https?://|www\.)[^\s<>\"'`\[\]]+", re.IGNORECASE)
_URL_TAIL = ".,;:!?)'\"*_"
# The blocks the prompt quotes sources, notes and the page in (core.answer.prompt), written
# out or escaped: a reply showing them is reciting its prompt.
_PROMPT_MARKUP = re.compile(
    r"(?:<|&lt;)\s*/?\s*(?:" + "|".join(PROMPT_TAGS) + r")\b", re.IGNORECASE
)
# A page's front matter (YAML between --- lines, TOML between +++ lines).
_FRONT_MATTER = re.compile(
    r"(?m)^(?P<fence>---|\+\+\+)[ \t]*\n"
    r"(?:[ \t]*[A-Za-z_][\w-]*[ \t]*[:=][^\n]*\n)+(?P=fence)[ \t]*$"
)
# A source's header copied as a block: "[Source 1] Shipping", "Source 2: https://...".
_SOURCE_HEADER = re.compile(
    r"(?im)^[ \t>*_]*(?:\[\s*(?:source|bron|quelle|fuente)\s*#?\s*\d+\s*\]"
    r"|(?:source|bron|quelle|fuente)\s*#?\s*\d+\s*:\s*\S)"
)
# Emphasis delimiters the parse left as text: an opener (before a word) or a closer (after
# one) without its partner. Intraword underscores (snake_case) are neither.
_LONE_STRONG = re.compile(r"\*\*|__")
_LONE_STAR = re.compile(r"(?<![\w*\\])\*(?=[^\s*])|(?<=[^\s*\\])\*(?![\w*])")
_LONE_UNDERSCORE = re.compile(r"(?<![\w\\])_(?=[^\s_])|(?<=[^\s_\\])_(?!\w)")
_SCRIPT = re.compile(r"<\s*/?\s*(?:script|style|iframe)\b", re.IGNORECASE)
_UNSAFE_LINK = re.compile(r"\]\(\s*<?\s*(?:javascript|vbscript|data|file):", re.IGNORECASE)
# How many unknown links one answer may send to the page look-up.
MAX_LOOKUPS = 10


@dataclass(frozen=True, slots=True)
class Knowledge:
    """What an answer may refer to: its sources (numbered 1..n in the prompt), the agent's
    contact route and website, and pages of the agent found for the answer's links.

    Phone numbers and e-mail addresses may come from those, or from the visitor's own
    question (``said``: "is my order for jan@example.org on its way?"); never from the page
    context or anything else a visitor sent beside it, which may carry planted ones. National
    numbers are read in ``region`` (`core.answer.contacts.phone_region`)."""

    source_urls: Sequence[str]
    source_texts: Sequence[str] = ()
    contact_route: str = ""
    site_url: str | None = None
    pages: frozenset[str] = field(default_factory=frozenset)
    said: str = ""
    region: str = "ZZ"

    def known_urls(self) -> set[str]:
        urls = {*self.source_urls, *self.pages}
        for text in [self.contact_route, *self.source_texts]:
            urls.update(_bare_urls(text))
        if self.site_url:
            urls.add(self.site_url)
        return {url_key(u, self.site_url) for u in urls}

    def known_addresses(self) -> set[str]:
        return {a for text in self.vouched() for a in email_addresses(text)}

    def gives_number(self, e164: str) -> bool:
        """Whether an answer may give the phone number ``e164``."""
        texts = self.vouched()
        known = {n for text in texts for n in phone_numbers(text, self.region)}
        return e164 in known or same_number(e164, texts)

    def known_domains(self) -> set[str]:
        """The registered domains an answer may name without a link: the sources' and the
        website's, and those their texts and the contact route name."""
        hosts = [urlsplit(u).hostname or "" for u in [*self.source_urls, *self.pages]]
        if self.site_url:
            hosts.append(urlsplit(self.site_url).hostname or "")
        for text in [self.contact_route, *self.source_texts]:
            hosts += [
                urlsplit(u if "//" in u else f"//{u}").hostname or "" for u in _bare_urls(text)
            ]
            hosts += [h.split("/", 1)[0].split(":", 1)[0] for h in bare_hosts(text)]
            hosts += [a.rsplit("@", 1)[1] for a in email_addresses(text)]
        return {d for d in map(registered_domain, hosts) if d}

    def vouched(self) -> list[str]:
        """The texts that vouch for a number or an address."""
        return [self.contact_route, *self.source_texts, self.said]


def url_key(url: str, site_url: str | None = None) -> str:
    """One spelling per page: host in lower case (the site's for a root-relative address),
    no "www.", no scheme, fragment or trailing slash."""
    url = url.strip()
    if url.lower().startswith("www."):
        url = "https://" + url
    parts = urlsplit(url)
    if not parts.netloc and site_url and url.startswith("/"):
        parts = urlsplit(urljoin(site_url.rstrip("/") + "/", url))
    host = parts.netloc.lower().removeprefix("www.")
    path = parts.path.rstrip("/") or "/"
    return f"{host}{path}" + (f"?{parts.query}" if parts.query else "")


def validate(answer: str, knowledge: Knowledge) -> list[str]:
    """Why ``answer`` may not be shown as written; empty when it may."""
    tokens = _MARKDOWN.parse(answer)
    reasons = [
        *_citation_reasons(tokens, len(knowledge.source_urls)),
        *_link_reasons(links(answer), knowledge),
        *_contact_reasons(tokens, knowledge),
        *_markdown_reasons(tokens, answer.split("\n")),
        *_markup_reasons(tokens, answer),
    ]
    return list(dict.fromkeys(reasons))


def links(answer: str) -> list[str]:
    """Every address the answer shows: Markdown links and images, autolinks, bare URLs."""
    found: list[str] = []
    for token in _inline(_MARKDOWN.parse(answer)):
        if token.type == "link_open":
            found.append(str(token.attrs.get("href", "")))
        elif token.type == "image":
            found.append(str(token.attrs.get("src", "")))
        elif token.type in ("text", "code_inline") and not _in_link(token):
            found += _bare_urls(token.content)
    return [url for url in dict.fromkeys(found) if url and not url.startswith("#")]


def _bare_urls(text: str) -> list[str]:
    return [m.group().rstrip(_URL_TAIL) for m in _BARE_URL.finditer(text)]


def _inline(tokens: Iterable[Token]) -> Iterator[Token]:
    """The inline tokens (text, links, code spans...) of every block, in order; a text token
    inside a link carries ``meta["in_link"]``."""
    for block in tokens:
        depth = 0
        for child in block.children or ():
            if child.type == "link_open":
                depth += 1
            elif child.type == "link_close":
                depth -= 1
            elif depth:
                child.meta["in_link"] = True
            yield child


def _in_link(token: Token) -> bool:
    return bool(token.meta.get("in_link"))


def _text(tokens: Iterable[Token]) -> Iterator[Token]:
    """The running text (never code, HTML or a link's own address)."""
    return (t for t in _inline(tokens) if t.type == "text")


# -- citations --------------------------------------------------------------------------


def _citation_reasons(tokens: Sequence[Token], count: int) -> list[str]:
    wrong = sorted(
        {
            int(n)
            for token in _text(tokens)
            for n in _CITATION.findall(token.content)
            if not 1 <= int(n) <= count
        }
    )
    if not wrong:
        return []
    cited = ", ".join(f"[{n}]" for n in wrong)
    if count == 0:
        allowed = "no sources were given, so cite none"
    else:
        allowed = f"cite only [1] to [{count}]" if count > 1 else "cite only [1]"
    which = f"citation {cited} refers" if len(wrong) == 1 else f"citations {cited} refer"
    return [f"{which} to no source ({allowed})"]


# -- links --------------------------------------------------------------------------------


def _link_reasons(urls: Sequence[str], knowledge: Knowledge) -> list[str]:
    known = knowledge.known_urls()
    addresses = knowledge.known_addresses()
    reasons = []
    for url in urls:
        scheme = urlsplit(url).scheme.lower()
        if scheme in ("mailto", "tel"):
            target = unquote(url.split(":", 1)[1].split("?", 1)[0]).strip().casefold()
            if scheme == "tel":
                dialled = phone_numbers(target, knowledge.region)
                vouched = bool(dialled) and all(map(knowledge.gives_number, dialled))
            else:
                vouched = target in addresses
            if target and not vouched and target not in knowledge.contact_route.casefold():
                reasons.append(f"the address {url} is not the contact route or in the sources")
        elif scheme in ("http", "https", "") and url_key(url, knowledge.site_url) not in known:
            reasons.append(
                f"the link {url} is not one of the sources or a page of this website: "
                "link only to the sources' addresses"
            )
        elif scheme not in ("http", "https", "", "mailto", "tel"):
            reasons.append(f"the link {url} is not a web address")
    return reasons


def _contact_reasons(tokens: Sequence[Token], knowledge: Knowledge) -> list[str]:
    """Phone numbers, e-mail addresses and hosts written out in the running text that the
    sources, the contact route and the question do not give (links are checked above)."""
    text = "\n".join(t.content for t in _inline(tokens) if t.type in ("text", "code_inline"))
    text = _BARE_URL.sub(" ", text)  # read as links; their digits are no phone numbers
    reasons = []
    numbers = phone_numbers(text, knowledge.region)
    read = [_digits(written) for written in numbers.values()]
    unread = [run for run in number_runs(text) if not any(d in _digits(run) for d in read)]
    for e164, written in numbers.items():
        if not knowledge.gives_number(e164):
            reasons.append(_number_reason(written))
    for run in unread:  # a number in a form the region does not read ("0900-..." in the US)
        if not same_digits(_digits(run), knowledge.vouched()):
            reasons.append(_number_reason(run))
    addresses = knowledge.known_addresses()
    for address in EMAIL.findall(text):
        if address.casefold() not in addresses:
            reasons.append(
                f"the address {address} is not the contact route or in the sources: "
                "give only addresses they give"
            )
    domains = knowledge.known_domains()
    for host in bare_hosts(EMAIL.sub(" ", text)):
        if registered_domain(host.split("/", 1)[0].split(":", 1)[0]) not in domains:
            reasons.append(
                f"the website {host} is not one of the sources or this website: "
                "name only the sources' addresses"
            )
    return reasons


def _number_reason(written: str) -> str:
    return (
        f"the phone number {written.strip()} is not the contact route or in the sources: "
        "give only numbers they give"
    )


def _digits(text: str) -> str:
    return re.sub(r"\D", "", text)


def unknown_links(answer: str, knowledge: Knowledge) -> list[str]:
    """The answer's web links its sources do not account for: those to look up among the
    agent's pages (at most `MAX_LOOKUPS`)."""
    known = knowledge.known_urls()
    return [
        url
        for url in links(answer)
        if urlsplit(url).scheme.lower() in ("http", "https", "")
        and url_key(url, knowledge.site_url) not in known
    ][:MAX_LOOKUPS]


# -- Markdown -------------------------------------------------------------------------------


def _markdown_reasons(tokens: Sequence[Token], lines: Sequence[str]) -> list[str]:
    reasons = []
    for token in tokens:
        if token.type == "fence" and not _closed_fence(token, lines):
            reasons.append(f"a code block ({token.markup}) is opened and never closed")
    text = [t.content for t in _text(tokens)]
    if any(_LONE_STRONG.search(t) for t in text):
        reasons.append("bold text (** or __) is opened or closed without its partner")
    if any(_LONE_STAR.search(t) or _LONE_UNDERSCORE.search(t) for t in text):
        reasons.append("emphasis (* or _) is opened or closed without its partner")
    if any("`" in t for t in text):
        reasons.append("a backtick (`) has no closing backtick")
    for block in tokens:
        if block.type != "inline":
            continue
        # Citations are balanced; a link the parse could not read leaves its brackets.
        words = "".join(t.content for t in block.children or () if t.type == "text")
        if _UNSAFE_LINK.search(words):
            # The parse refuses such a link; it is no broken Markdown but no web address.
            reasons.append("a link to javascript:, data: or a file is not a web address")
        elif "](" in words:
            reasons.append("a link is not closed: write it as [text](address)")
        elif words.count("[") != words.count("]"):
            reasons.append("a square bracket ([ or ]) has no partner")
    return reasons


def _closed_fence(token: Token, lines: Sequence[str]) -> bool:
    start, end = token.map or (0, 0)
    if end - 1 <= start or end > len(lines):
        return False
    last = lines[end - 1].strip()
    return last.startswith(token.markup) and set(last) == {token.markup[0]}


# -- copied markup --------------------------------------------------------------------------


def _markup_reasons(tokens: Sequence[Token], answer: str) -> list[str]:
    reasons = []
    if _PROMPT_MARKUP.search(answer):
        reasons.append("it copies the prompt's <source> markup: write the answer in your own words")
    html = [
        t.content
        for t in [*tokens, *_inline(tokens)]
        if t.type in ("html_block", "html_inline") and not _PROMPT_MARKUP.match(t.content)
    ]
    if any(_SCRIPT.search(h) for h in html):
        reasons.append("it contains a <script>, <style> or <iframe> tag")
    elif html:
        reasons.append("it contains raw HTML tags: use Markdown only")
    if _FRONT_MATTER.search(answer):
        reasons.append("it copies a page's front matter (the --- block of fields)")
    if _SOURCE_HEADER.search(answer):
        reasons.append('it copies a source\'s header ("[Source 1] ..."): cite as [1] instead')
    return reasons
