"""What every messaging channel shares when it sends: splitting, results, errors, typing."""

from __future__ import annotations

import asyncio
import email.utils
import logging
import re
import time
import unicodedata
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Protocol

log = logging.getLogger(__name__)

__all__ = [
    "DeliveryError",
    "Sender",
    "Sent",
    "SentFinder",
    "deliver_parts",
    "keep_typing",
    "parse_retry_after",
    "split_message",
]


@dataclass(frozen=True, slots=True)
class Sent:
    """One part the provider accepted, with the id it gave it (Twilio `SM...`, Telegram id).

    ``status`` is the provider's delivery status when known (a look-up reports it).
    """

    provider_message_id: str
    status: str | None = None


class DeliveryError(Exception):
    """A reply, or one part of it, was not accepted by the provider.

    ``permanent`` errors must not be retried (invalid number, blocked bot, outside WhatsApp's
    24-hour window); transient ones may be, not before ``retry_after`` seconds when given.
    ``code`` is the provider's error code when it has one (Twilio ``21617``), else a short
    slug (``timeout``, ``forbidden``). When a multi-part reply fails, ``part`` is the 1-based
    number of the failing part out of ``parts`` and ``sent`` lists the parts accepted before
    it, so a retry can resume with ``skip=len(sent)`` instead of sending them twice.

    ``ambiguous`` says the request may have reached the provider and been accepted, only its
    answer never arrived (a timeout after the request went out, a connection dropped while
    waiting). Before such a part is sent again, a provider that can be asked (Twilio) is asked
    whether it has it. An error the provider answered with, or a connection that was never
    made, is not ambiguous: nothing was accepted.
    """

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        permanent: bool = False,
        retry_after: float | None = None,
        ambiguous: bool = False,
        sent: Sequence[Sent] = (),
        part: int | None = None,
        parts: int | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.permanent = permanent
        self.retry_after = retry_after
        self.ambiguous = ambiguous
        self.sent: list[Sent] = list(sent)
        self.part = part
        self.parts = parts

    def at_part(self, part: int, parts: int, sent: Sequence[Sent]) -> DeliveryError:
        """The same failure, saying which part failed and which were sent before it."""
        return DeliveryError(
            f"part {part} of {parts}: {self.message}",
            code=self.code,
            permanent=self.permanent,
            retry_after=self.retry_after,
            ambiguous=self.ambiguous,
            sent=sent,
            part=part,
            parts=parts,
        )

    def __repr__(self) -> str:
        return (
            f"DeliveryError({self.message!r}, code={self.code!r}, permanent={self.permanent}, "
            f"retry_after={self.retry_after!r}, ambiguous={self.ambiguous}, "
            f"sent={len(self.sent)})"
        )


class Sender(Protocol):
    """Sends a reply on one channel; implemented by `TwilioSender` and `TelegramSender`."""

    async def send(self, recipient: str, text: str, *, skip: int = 0) -> list[Sent]:
        """Split ``text`` at the channel's limit and send the parts in order.

        ``skip`` parts are left out: they went out in an earlier attempt (splitting is
        deterministic, so the same text gives the same parts). Returns the parts sent now;
        raises `DeliveryError` at the first part that fails.
        """
        ...


class SentFinder(Protocol):
    """A sender that can ask its provider which messages it accepted (Twilio can; Telegram's
    Bot API has no such look-up)."""

    async def find_sent(self, recipient: str, text: str, since: datetime) -> list[Sent]:
        """The messages with body ``text`` (one part) the provider accepted for ``recipient``
        from ``since`` on, oldest first; raises `DeliveryError` when it cannot be asked."""
        ...


async def deliver_parts(
    parts: Sequence[str], send_one: Callable[[str], Awaitable[Sent]], *, skip: int = 0
) -> list[Sent]:
    """Send ``parts[skip:]`` in order, stopping at the first failure (see `DeliveryError`)."""
    sent: list[Sent] = []
    for number, part in enumerate(parts[skip:], start=skip + 1):
        try:
            sent.append(await send_one(part))
        except DeliveryError as exc:
            raise exc.at_part(number, len(parts), sent) from exc
    return sent


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
            await asyncio.wait_for(until.wait(), interval)
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
