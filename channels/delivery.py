"""What every messaging channel shares when it sends: splitting, Retry-After, typing.

The delivery contract itself (`Sender`, `Sent`, `DeliveryError`) is core's: `core.delivery`.
"""

from __future__ import annotations

import asyncio
import email.utils
import logging
import re
import time
import unicodedata
from collections.abc import Awaitable, Callable

from core.delivery import DeliveryError

log = logging.getLogger(__name__)

__all__ = ["keep_typing", "parse_retry_after", "split_message"]


def parse_retry_after(value: str | None) -> float | None:
    """Seconds from a ``Retry-After`` header: a number of seconds or an HTTP date."""
    if not value:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


async def keep_typing(
    action: Callable[[], Awaitable[None]], until: asyncio.Event, *, interval: float = 4.0
) -> None:
    """Call ``action`` now and every ``interval`` seconds until ``until`` is set.

    Typing indicators are a courtesy: a transient failure is logged and the next beat tried;
    a permanent one (blocked bot) ends the loop, since every later beat would fail too.
    """
    while not until.is_set():
        try:
            await action()
        except DeliveryError as exc:
            log.warning("delivery.typing.failed", extra={"code": exc.code})
            if exc.permanent:
                return
        try:
            async with asyncio.timeout(interval):
                await until.wait()
        except TimeoutError:
            continue


# -- splitting ----------------------------------------------------------------------------

# Spans a cut should not fall inside: HTML entities, Markdown links and images, bare URLs.
# Separate patterns, so that an entity inside an over-long URL is still protected.
_PROTECTED = (
    re.compile(r"&(?:#[0-9]{1,7}|#[xX][0-9a-fA-F]{1,6}|[A-Za-z][A-Za-z0-9]{1,31});"),
    re.compile(r"!?\[[^\[\]\n]*\]\([^()\s]*(?:\s+\"[^\"\n]*\")?\)"),
    # a URL may hold balanced parentheses (Wikipedia); an unmatched ")" ends it (Markdown)
    re.compile(r"https?://(?:[^\s\[\]<>()]|\([^\s()]*\))+"),
)
# Each boundary regex yields the index where a part may end (before the separating space).
_PARAGRAPH = re.compile(r"\n(?=[^\S\n]*\n)")
_LINE = re.compile(r"\n")
_SENTENCE = re.compile(r"[.!?…]+[\"'”’»)\]]*(?=\s)|[。！？]+[」』”’)）]*")
_WORD = re.compile(r"\s")
_LEVELS = (_PARAGRAPH, _LINE, _SENTENCE, _WORD)
# How far past the window a boundary regex may look (to see the second newline, say).
_LOOKAHEAD = 64

_ZWJ = "\u200d"


def _is_extender(char: str) -> bool:
    """Characters that continue the grapheme cluster before them (approximately UAX #29)."""
    code = ord(char)
    return (
        unicodedata.category(char) in ("Mn", "Me", "Mc")
        or char in (_ZWJ, "\u200c")
        or 0xFE00 <= code <= 0xFE0F  # variation selectors (emoji vs text presentation)
        or 0xE0100 <= code <= 0xE01EF
        or 0x1F3FB <= code <= 0x1F3FF  # skin-tone modifiers
        or 0xE0020 <= code <= 0xE007F  # tag characters (subdivision flags)
        or 0x1160 <= code <= 0x11FF  # Hangul jamo vowels and finals
    )


def _is_regional_indicator(char: str) -> bool:
    return 0x1F1E6 <= ord(char) <= 0x1F1FF


def _inside_cluster(text: str, index: int) -> bool:
    """Whether a cut before ``text[index]`` would split a user-perceived character."""
    if index <= 0 or index >= len(text):
        return False
    before, after = text[index - 1], text[index]
    if before == "\r" and after == "\n":
        return True
    if before == _ZWJ or _is_extender(after):
        return True
    if _is_regional_indicator(before) and _is_regional_indicator(after):
        # Flags are pairs: cutting is fine only after an even number of indicators.
        run = 0
        while index - run - 1 >= 0 and _is_regional_indicator(text[index - run - 1]):
            run += 1
        return run % 2 == 1
    return False


def _protected_cuts(text: str, limit: int) -> set[int]:
    """Indices a cut should avoid because they fall inside an entity, link or URL.

    A span longer than ``limit`` cannot be kept whole anyway, so it protects nothing and its
    inner word boundaries stay usable.
    """
    blocked: set[int] = set()
    for pattern in _PROTECTED:
        for match in pattern.finditer(text):
            if match.end() - match.start() <= limit:
                blocked.update(range(match.start() + 1, match.end()))
    return blocked


def _boundaries(pattern: re.Pattern[str], text: str, start: int, end: int) -> list[int]:
    """Indices in ``(start, end]`` where ``pattern`` says a part may end, ascending."""
    found = []
    window_end = min(len(text), end + 1 + _LOOKAHEAD)
    for match in pattern.finditer(text, start, window_end):
        index = match.start() if pattern is not _SENTENCE else match.end()
        if index > end:
            break
        if index > start:
            found.append(index)
    return found


def _choose_cut(text: str, start: int, limit: int, blocked: set[int]) -> int:
    end = start + limit

    def fine(index: int) -> bool:
        return index not in blocked and not _inside_cluster(text, index)

    # A boundary of a higher level wins if it fills at least half a part; otherwise parts
    # would come out tiny (a short first paragraph, then a long one cut anyway).
    half = start + max(1, limit // 2)
    candidates = [[i for i in _boundaries(level, text, start, end) if fine(i)] for level in _LEVELS]
    for found in candidates:
        if found and found[-1] >= half:
            return found[-1]
    for found in candidates:
        if found:
            return found[-1]
    for index in range(end, start, -1):
        if fine(index):
            return index
    for index in range(end, start, -1):
        if not _inside_cluster(text, index):
            return index
    return end  # a single "character" longer than a part: nothing better exists


def split_message(text: str, limit: int) -> list[str]:
    """Split ``text`` into parts of at most ``limit`` characters, in order.

    Cuts go on paragraph, then line, then sentence, then word boundaries, and only as a last
    resort anywhere else; never inside a grapheme cluster (emoji with modifiers or ZWJ, flags,
    combining accents) and, where a part can hold them whole, never inside an HTML entity,
    a Markdown link or a URL. Whitespace at each cut is dropped; no part is empty.
    """
    if limit < 1:
        raise ValueError("limit must be at least 1")
    length = len(text.rstrip())
    blocked = _protected_cuts(text, limit)
    parts: list[str] = []
    start = 0
    while True:
        while start < length and text[start].isspace():
            start += 1
        if start >= length:
            return parts
        if length - start <= limit:
            parts.append(text[start:length])
            return parts
        cut = _choose_cut(text, start, limit, blocked)
        parts.append(text[start:cut].rstrip())
        start = cut
