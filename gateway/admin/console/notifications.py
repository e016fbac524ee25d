"""Staff are told, in every console page: how many customers wait for a person, live (SSE).

``GET /admin/events/waiting`` streams ``waiting`` ``{"count"}`` when the number of waiting
conversations changes, and ``notification`` ``{"id", "type", "agent", "channel",
"conversation_id", "customer", "url"}`` for each new "asked for a person" or "waits too long"
event (its id is the event's id, so a reconnect resumes after Last-Event-ID). It is woken by
the conversations' LISTEN/NOTIFY feed, and recounts every ``KEEPALIVE_SECONDS`` besides, since
a wait grows too long without anything being stored. `gateway/static/notify.js` follows it.
It ends within seconds of its session ending or its account being disabled
(`gateway.admin.guard.while_allowed`); the browser's reconnect then meets the sign-in page.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
from typing import Any

from aiohttp import web

from core.handoff import Follower
from core.store.notifications import Notifications
from core.store.staff import Role
from gateway.admin.api import list_notifications
from gateway.admin.console.render import Route, admin, route, run
from gateway.admin.guard import while_allowed
from gateway.admin.schemas import NotificationList, NotificationQuery
from gateway.keys import CONVERSATION_FEED, SETTINGS

log = logging.getLogger(__name__)

EVENTS = "/admin/events/waiting"
EVENTS_ROLE: Role = "agent"
_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-store, no-transform",
    "X-Accel-Buffering": "no",
    "X-Content-Type-Options": "nosniff",
}
KEEPALIVE_SECONDS = 20.0
STREAM_SECONDS = 30 * 60.0
# A busy feed wakes the stream often; counting at most this often keeps each tab's cost low.
RECOUNT_PAUSE = 1.0
_EVENT_ID = re.compile(r"[0-9]{1,18}")


def _frame(kind: str, data: dict[str, Any], event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {kind}\ndata: {json.dumps(data, ensure_ascii=False)}\n\n".encode()


async def waiting_events(request: web.Request) -> web.StreamResponse:
    store = admin(request).notifications
    longer_than = request.app[SETTINGS].notify_waiting_minutes * 60
    resume = request.headers.get("Last-Event-ID", "")
    async with request.app[CONVERSATION_FEED].watch() as watcher:
        # Watching first, reading second: nothing written in between is missed.
        after = int(resume) if _EVENT_ID.fullmatch(resume) else await store.last_id()
        response = web.StreamResponse(headers=_HEADERS)
        await response.prepare(request)
        try:
            await response.write(b"retry: 3000\n\n")
            followed = await while_allowed(
                request,
                EVENTS_ROLE,
                _follow(response, watcher, store, after, longer_than),
            )
        except ConnectionResetError:
            log.debug("console.events.client_gone")
            return response
        if followed is None:
            log.info("console.events.ended reason=signed_out")
    with contextlib.suppress(ConnectionResetError):
        await response.write_eof()
    return response


async def _follow(
    response: web.StreamResponse,
    watcher: Follower,
    store: Notifications,
    after: int,
    longer_than: float,
) -> str:
    """Send the count and new events until the stream's time is up or the feed closes."""
    loop = asyncio.get_running_loop()
    ends = loop.time() + STREAM_SECONDS
    count: int | None = None
    while not watcher.closed:
        now = await store.waiting_count(longer_than)
        if now != count:
            count = now
            await response.write(_frame("waiting", {"count": count}))
        for item in await store.since(after):
            data = {
                "id": item.id,
                "type": item.type,
                "agent": item.agent,
                "channel": item.channel,
                "conversation_id": item.conversation_id,
                "customer": item.customer,
                "url": f"/admin/conversations/{item.conversation_id}",
            }
            await response.write(_frame("notification", data, item.id))
            after = item.id
        left = ends - loop.time()
        if left <= 0:
            return "time_up"
        if await watcher.wait(min(KEEPALIVE_SECONDS, left)):
            await asyncio.sleep(RECOUNT_PAUSE)
        else:
            await response.write(b": keep-alive\n\n")
    return "feed_closed"


async def recent_deliveries(request: web.Request, limit: int = 20) -> NotificationList:
    """The newest events and their webhook deliveries, for the inbox page."""
    return await run(
        list_notifications,
        request,
        NotificationList,
        query=NotificationQuery.model_validate({"limit": limit}),
    )


def routes() -> list[Route]:
    return [route("GET", EVENTS, waiting_events, role=EVENTS_ROLE)]
