"""The widget's live stream of a conversation: staff replies and handoff changes, as SSE.

``GET /api/v1/agents/{agent}/conversations/events?session_id=...&key=...&since=...``

The browser's EventSource sends no custom headers, so the widget key comes in the query
string; the origin check is the chat route's. Each event carries the stored message's id:
a reconnect resumes after ``Last-Event-ID`` (or ``since``), so what was stored while the
stream was down arrives then. Events:

- ``state`` ``{"status"}``: the conversation's handoff status when the stream opens;
- ``staff`` ``{"id", "text", "created_at"}``: a message from a person;
- ``handoff`` ``{"id", "status", "created_at"}``: staff took over (``staff``), handed back
  (``bot``), or the visitor now waits for them (``waiting_for_staff``).
- ``typing`` ``{"staff"}``: a staff member is writing a reply (sent again every few
  seconds while they write).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

from aiohttp import web

from channels.inbound import find_agent
from channels.web import WebChannel
from core.errors import InvalidInput, RateLimited
from core.handoff import ConversationFeed
from core.ports import Cache
from core.store.agents import Agents
from core.store.handoff import FeedMessage

log = logging.getLogger(__name__)

_SESSION = re.compile(r"[A-Za-z0-9_-]{8,100}")  # the chat route's session ids
_MESSAGE_ID = re.compile(r"[0-9]{1,19}")
MAX_MESSAGE_ID = 2**63 - 1  # messages.id is a bigint
_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",  # nginx: do not hold the stream back
}
# Proxies close connections that stay silent for a minute or so; a comment keeps it open,
# and shows that the visitor has gone when it cannot be written.
KEEPALIVE_SECONDS = 20.0
# Streams end after this long and the browser opens a new one, so that no connection ties
# a visitor to one server for a whole day.
STREAM_SECONDS = 30 * 60.0
RECONNECT_MS = 3000
# Streams opened per address: (per second, burst). Reopening after a drop is normal.
OPEN_RATE = (0.5, 10.0)


def _frame(kind: str, data: dict[str, Any], event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


def _message_frame(message: FeedMessage) -> bytes:
    when = message.created_at.isoformat()
    if message.role == "staff":
        data = {"id": message.id, "text": message.text, "created_at": when}
        return _frame("staff", data, message.id)
    data = {"id": message.id, "status": message.text, "created_at": when}
    return _frame("handoff", data, message.id)


def _resume_after(request: web.Request) -> int | None:
    """The last message the browser has: Last-Event-ID on a reconnect, else ``since``."""
    for value, where in (
        (request.headers.get("Last-Event-ID"), "Last-Event-ID"),
        (request.query.get("since"), "since"),
    ):
        if value is None or value == "":
            continue
        # ASCII digits only (str.isdigit() also takes "²", which int() refuses), and within
        # PostgreSQL's bigint, checked before the stream opens: afterwards no error can be told.
        if not _MESSAGE_ID.fullmatch(value) or int(value) > MAX_MESSAGE_ID:
            raise InvalidInput(f"{where}: must be a message id (a whole number)")
        return int(value)
    return None


class WidgetEvents:
    def __init__(
        self,
        web_channel: WebChannel,
        agents: Agents,
        cache: Cache,
        feed: ConversationFeed,
        *,
        keepalive: float = KEEPALIVE_SECONDS,
        lifetime: float = STREAM_SECONDS,
    ) -> None:
        self._web = web_channel
        self._agents = agents
        self._cache = cache
        self._feed = feed
        self._keepalive = keepalive
        self._lifetime = lifetime

    async def stream(self, request: web.Request) -> web.StreamResponse:
        agent = await find_agent(self._agents, request.match_info["agent"])
        cors = self._web.admit(agent, request, request.query.get("key", ""), "key")
        session = request.query.get("session_id", "")
        if not _SESSION.fullmatch(session):
            raise InvalidInput("session_id: must be 8-100 letters, digits, '-' or '_'")
        after = _resume_after(request)
        rate, burst = OPEN_RATE
        bucket = await self._cache.take_token(
            f"rate:web:{agent.id}:events:{self._web.client_address(request)}",
            rate=rate,
            capacity=burst,
        )
        if not bucket.allowed:
            raise RateLimited("too many live streams opened; please wait", bucket.retry_after)

        store = self._feed.store
        async with self._feed.follow(agent.id, "web", session) as follower:
            # Following first, reading second: nothing stored in between can be missed.
            if after is None:
                after = await store.last_message_id(agent.id, "web", session)
            state = await store.state(agent.id, "web", session)
            response = web.StreamResponse(headers=_HEADERS | cors)
            await response.prepare(request)
            loop = asyncio.get_running_loop()
            ends = loop.time() + self._lifetime
            try:
                await response.write(f"retry: {RECONNECT_MS}\n\n".encode())
                await response.write(_frame("state", {"status": state.status if state else "bot"}))
                while not follower.closed:
                    for message in await self._feed.since(agent.id, "web", session, after):
                        await response.write(_message_frame(message))
                        after = message.id
                    if follower.typing is not None:
                        await response.write(_frame("typing", {"staff": follower.typing}))
                        follower.typing = None
                    left = ends - loop.time()
                    if left <= 0:
                        break
                    if not await follower.wait(min(self._keepalive, left)):
                        await response.write(b": keep-alive\n\n")
            except ConnectionResetError:
                log.debug("web.events.client_gone agent=%s", agent.slug)
                return response
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response
