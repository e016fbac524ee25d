"""Human handoff: staff take a conversation over, reply in it, hand it back; followers are woken.

`Handoff` is what the staff console and the admin API call. `ConversationFeed` wakes whoever
follows a conversation (the widget's live stream) when something they should see is stored,
in whichever gateway process it was stored: each process keeps one connection that LISTENs
for the store's NOTIFY. Followers re-read from Postgres when woken, and also every little
while, so a lost notification (a dropped connection, a pooler without LISTEN) only delays.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import asyncpg

from core.delivery import Channels, Template
from core.errors import Conflict, InvalidInput, Unavailable
from core.store.handoff import (
    FEED_CHANNEL,
    LIVE_CHANNEL,
    ConversationState,
    FeedMessage,
    HandoffStore,
)

log = logging.getLogger(__name__)


class Forgetful(Protocol):
    """The bot's memory of a conversation (`core.memory.ConversationMemory` fits)."""

    async def forget(self, conversation_id: int) -> None: ...


MAX_REPLY_CHARS = 10_000
MAX_STAFF_NAME = 200


def elapsed(delta: timedelta) -> str:
    """A stretch of time as staff say it: "40 minutes", "26 hours", "3 days"."""
    minutes = max(int(delta.total_seconds() // 60), 0)
    if minutes < 60:
        amount, unit = minutes, "minute"
    elif minutes < 48 * 60:
        amount, unit = minutes // 60, "hour"
    else:
        amount, unit = minutes // (24 * 60), "day"
    return f"{amount} {unit}{'' if amount == 1 else 's'}"


@dataclass(frozen=True, slots=True)
class CustomerWindow:
    """A conversation's customer-service window (WhatsApp): free text reaches the customer
    only within ``hours`` of their last message; after that, only an approved template.
    Open while the customer has not written at all (nothing to measure from)."""

    hours: float
    customer_wrote_at: datetime | None
    now: datetime

    @property
    def closes_at(self) -> datetime | None:
        if self.customer_wrote_at is None:
            return None
        return self.customer_wrote_at + timedelta(hours=self.hours)

    @property
    def open(self) -> bool:
        closes = self.closes_at
        return closes is None or self.now < closes

    @property
    def since_customer_wrote(self) -> str:
        """How long ago the customer last wrote ("26 hours"); "" when they never did."""
        if self.customer_wrote_at is None:
            return ""
        return elapsed(self.now - self.customer_wrote_at)


def _staff_name(staff: str) -> str:
    name = staff.strip()
    if not name or len(name) > MAX_STAFF_NAME:
        raise InvalidInput(f"staff must name who acts, in 1-{MAX_STAFF_NAME} characters")
    return name


class Handoff:
    """Taking a conversation over, replying in it and handing it back.

    ``channels`` are the messaging channels' rules (core imports no channel, so the gateway
    passes its registry, as for the inbox worker): how a reply is cut into the parts a
    messaging app is sent, and how long after the customer's last message a free-form reply
    may still go out (WhatsApp: 24 hours; after that only an approved template). Replies
    reach the widget live through `ConversationFeed`, and messaging apps through the outbox.
    ``memory`` forgets what it cached of a conversation that staff wrote in, so the bot,
    once back, reads what staff said.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        *,
        channels: Channels | None = None,
        memory: Forgetful | None = None,
    ) -> None:
        self._store = HandoffStore(pool)
        self._channels = dict(channels or {})
        self._memory = memory

    async def state(self, conversation_id: int) -> ConversationState:
        return await self._store.conversation(conversation_id)

    async def take_over(self, conversation_id: int, staff: str) -> None:
        """The bot is paused for this conversation until `hand_back`; the visitor is told."""
        name = _staff_name(staff)
        state = await self._store.conversation(conversation_id)
        if state.channel != LIVE_CHANNEL and state.channel not in self._channels:
            raise InvalidInput(f"staff cannot reach a visitor on the {state.channel} channel")
        if await self._store.change_status(conversation_id, "staff", author=name):
            log.info("handoff.taken_over conversation_id=%d", conversation_id)

    async def hand_back(self, conversation_id: int) -> None:
        """The bot answers this conversation again."""
        if await self._store.change_status(conversation_id, "bot", author=None):
            log.info("handoff.handed_back conversation_id=%d", conversation_id)
        if self._memory is not None:
            await self._memory.forget(conversation_id)

    async def reply(self, conversation_id: int, text: str, staff: str) -> int:
        """Store a staff message and send it through the conversation's own channel; returns
        the stored message's id. Replying takes the conversation over if staff had not yet."""
        name = _staff_name(staff)
        body = text.strip()
        if not body:
            raise InvalidInput("a reply needs some text")
        if len(body) > MAX_REPLY_CHARS:
            raise InvalidInput(f"a reply may be at most {MAX_REPLY_CHARS} characters")
        message_id = await self._store.add_staff_reply(conversation_id, body, name, self._split)
        if self._memory is not None:
            await self._memory.forget(conversation_id)
        log.info("handoff.replied conversation_id=%d message_id=%d", conversation_id, message_id)
        return message_id

    def window(self, state: ConversationState) -> CustomerWindow | None:
        """The conversation's customer window, as of now (None: its channel has none)."""
        rules = self._channels.get(state.channel)
        hours = rules.customer_window_hours if rules is not None else None
        if hours is None:
            return None
        return CustomerWindow(hours, state.customer_wrote_at, datetime.now(UTC))

    def window_closed_at(self, state: ConversationState) -> datetime | None:
        """When the channel's customer window closed (None: it is open, or has none)."""
        window = self.window(state)
        return None if window is None or window.open else window.closes_at

    def _split(self, state: ConversationState, text: str) -> list[str] | None:
        rules = self._channels.get(state.channel)
        if rules is None:
            return None
        window = self.window(state)
        if window is not None and not window.open:
            # Refused here, before anything is stored or queued: the provider would only
            # fail it later (Twilio 63016, Meta 131047), after staff had moved on.
            raise Conflict(
                f"The customer last wrote {window.since_customer_wrote} ago. {rules.title} "
                f"only delivers approved templates now (free text only within "
                f"{window.hours:g} hours of the customer's last message): send a template."
            )
        return [p for p in rules.reply_parts(text) if p.strip()]

    async def send_template(
        self, conversation_id: int, template: Template, values: Sequence[str], staff: str
    ) -> int:
        """Send an approved template (outside the customer window, or any time); the text
        stored in the conversation is the template's, filled in, so the bot's memory of the
        next turn sees what the customer read. Returns the stored message's id."""
        name = _staff_name(staff)
        if len(values) != template.variables:
            raise InvalidInput(
                f"template {template.name!r} takes {template.variables} values, not {len(values)}"
            )
        if any(not v.strip() or len(v) > 1000 for v in values):
            raise InvalidInput("each template value needs 1-1000 characters")
        text = template.render([v.strip() for v in values])

        def parts(state: ConversationState, _: str) -> list[str] | None:
            if state.channel not in self._channels:
                raise InvalidInput(f"{state.channel} conversations have no templates")
            return [text]

        message_id = await self._store.add_staff_reply(
            conversation_id,
            text,
            name,
            parts,
            template={
                "name": template.name,
                "provider_id": template.provider_id,
                "language": template.language,
                "values": [v.strip() for v in values],
            },
        )
        if self._memory is not None:
            await self._memory.forget(conversation_id)
        log.info(
            "handoff.template_sent conversation_id=%d message_id=%d", conversation_id, message_id
        )
        return message_id


class Follower:
    """One follower of one conversation: woken when something new may be there to read."""

    def __init__(self) -> None:
        self._woken = asyncio.Event()
        self.closed = False
        self.typing: str | None = None  # staff announced as writing since last read

    def wake(self) -> None:
        self._woken.set()

    async def wait(self, within: float) -> bool:
        """True when woken within ``within`` seconds (or the feed closed), else False."""
        try:
            async with asyncio.timeout(within):
                await self._woken.wait()
        except TimeoutError:
            return False
        self._woken.clear()
        return True


_Key = tuple[int, str, str]


class TooManyFollowers(Unavailable):
    """This process follows as many conversations as it is allowed to."""

    code = "too_many_streams"

    def __init__(self) -> None:
        super().__init__("too many live conversations on this server; try again later")


class ConversationFeed:
    """Wakes the followers of a conversation when the store announces something for it.

    One LISTEN connection per process, to the pool's database; when it drops it is opened
    again, and every follower is woken to catch up on what it may have missed.
    """

    def __init__(
        self,
        pool: asyncpg.Pool,
        url: str,
        *,
        max_followers: int = 5000,
        reconnect_delay: float = 1.0,
    ) -> None:
        self._store = HandoffStore(pool)
        self._url = url
        self._max = max_followers
        self._delay = reconnect_delay
        self._followers: dict[_Key, set[Follower]] = {}
        self._watchers: set[Follower] = set()  # live conversation lists: woken by any change
        self._conn: asyncpg.Connection | None = None
        self._reconnect: asyncio.Task[None] | None = None
        self._closed = False

    @property
    def listening(self) -> bool:
        return self._conn is not None and not self._conn.is_closed()

    @property
    def store(self) -> HandoffStore:
        return self._store

    async def start(self) -> None:
        """Start listening; when the database refuses, keep trying in the background."""
        if not await self._listen():
            self._schedule_reconnect()

    async def close(self) -> None:
        """Stop listening and release every follower (their streams end)."""
        self._closed = True
        if self._reconnect is not None:
            self._reconnect.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._reconnect
        for followers in [*self._followers.values(), self._watchers]:
            for follower in followers:
                follower.closed = True
                follower.wake()
        conn, self._conn = self._conn, None
        if conn is not None and not conn.is_closed():
            with contextlib.suppress(OSError, asyncpg.InterfaceError, asyncpg.PostgresError):
                await conn.close(timeout=5)

    @asynccontextmanager
    async def follow(self, agent_id: int, channel: str, key: str) -> AsyncIterator[Follower]:
        """Follow a conversation (which may not exist yet) for as long as the block runs."""
        if self._closed:
            raise Unavailable("the server is shutting down")
        if sum(len(f) for f in self._followers.values()) >= self._max:
            raise TooManyFollowers()
        follower = Follower()
        self._followers.setdefault((agent_id, channel, key), set()).add(follower)
        try:
            yield follower
        finally:
            followers = self._followers.get((agent_id, channel, key))
            if followers is not None:
                followers.discard(follower)
                if not followers:
                    del self._followers[(agent_id, channel, key)]

    @asynccontextmanager
    async def watch(self) -> AsyncIterator[Follower]:
        """Be woken when anything happens in any conversation (the staff's live list)."""
        if self._closed:
            raise Unavailable("the server is shutting down")
        if len(self._watchers) + sum(len(f) for f in self._followers.values()) >= self._max:
            raise TooManyFollowers()
        watcher = Follower()
        self._watchers.add(watcher)
        try:
            yield watcher
        finally:
            self._watchers.discard(watcher)

    async def since(self, agent_id: int, channel: str, key: str, after: int) -> list[FeedMessage]:
        return await self._store.feed_since(agent_id, channel, key, after)

    async def _listen(self) -> bool:
        try:
            conn = await asyncpg.connect(self._url, timeout=10)
        except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("handoff.feed.connect_failed error=%s", type(exc).__name__)
            return False
        try:
            await conn.add_listener(FEED_CHANNEL, self._on_notify)
        except (OSError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
            log.warning("handoff.feed.listen_failed error=%s", type(exc).__name__)
            await conn.close()
            return False
        conn.add_termination_listener(self._on_lost)
        self._conn = conn
        return True

    def _on_notify(self, conn: Any, pid: int, channel: str, payload: object) -> None:
        try:
            data = json.loads(str(payload))
            key = (int(data["agent_id"]), str(data["channel"]), str(data["key"]))
        except (ValueError, KeyError, TypeError):
            log.warning("handoff.feed.bad_payload")
            return
        for watcher in self._watchers:
            watcher.wake()
        kind = data.get("kind")
        if kind in ("message", "inbox"):
            return  # for the lists; what a conversation's followers see is announced apart
        for follower in self._followers.get(key, ()):
            if kind == "typing":
                follower.typing = str(data.get("staff") or "Staff")[:100]
            follower.wake()

    def _on_lost(self, conn: Any) -> None:
        if self._closed:
            return
        log.warning("handoff.feed.connection_lost")
        self._conn = None
        self._schedule_reconnect()

    def _schedule_reconnect(self) -> None:
        if self._closed or (self._reconnect is not None and not self._reconnect.done()):
            return
        self._reconnect = asyncio.get_running_loop().create_task(self._reconnect_loop())

    async def _reconnect_loop(self) -> None:
        delay = self._delay
        while not self._closed:
            await asyncio.sleep(delay)
            if await self._listen():
                log.info("handoff.feed.listening_again")
                # Whatever was announced while nobody listened: let every follower re-read.
                for followers in [*self._followers.values(), self._watchers]:
                    for follower in followers:
                        follower.wake()
                return
            delay = min(delay * 2, 30.0)
