"""The console's inbox page: messaging customers whose answer failed or is late, and retry."""

from __future__ import annotations

from datetime import UTC, datetime

from aiohttp import web

from core.errors import ParleyError
from gateway.admin.api import list_inbox, retry_inbox
from gateway.admin.console.notifications import recent_deliveries
from gateway.admin.console.render import (
    Route,
    admin,
    call,
    form,
    ids,
    page,
    redirect,
    render,
    route,
    run,
    text,
    validated,
)
from gateway.admin.schemas import InboxList, InboxMessageOut, InboxQuery, InboxRetryBody
from gateway.middlewares import status_for

PAGE = "/admin/inbox"


def _retryable(message: InboxMessageOut, now: datetime) -> bool:
    """Failed, or waiting out the pause after a failed try: what a retry can hurry."""
    if message.status == "failed":
        return True
    due = message.next_attempt_at
    return message.status == "pending" and due is not None and due > now


async def _inbox_page(
    request: web.Request, *, error: str | None = None, status: int = 200
) -> web.Response:
    listed = await run(
        list_inbox, request, InboxList, query=InboxQuery.model_validate({"limit": 500})
    )
    now = datetime.now(UTC)
    failed = [m for m in listed.items if m.status == "failed"]
    waiting = [m for m in listed.items if m.status != "failed"]
    agents = await admin(request).agents.list()
    return await render(
        request,
        "admin/inbox.html",
        title="Inbox: failed and late answers",
        section="inbox",
        error=error,
        status=status,
        failed=failed,
        waiting=waiting,
        retryable={m.id for m in listed.items if _retryable(m, now)},
        stuck_after=round(listed.stuck_after_seconds),
        zones={a.slug: a.timezone for a in agents},
        deliveries=await recent_deliveries(request),
    )


@page
async def inbox_page(request: web.Request) -> web.StreamResponse:
    return await _inbox_page(request)


@page
async def retry_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    try:
        body = validated(InboxRetryBody, {"ids": ids(text(data, "ids").split(","))})
        await retry_inbox(call(request, body=body))
    except ParleyError as exc:
        return await _inbox_page(request, error=exc.message, status=status_for(exc))
    raise redirect(PAGE, "inbox-retried")


def routes() -> list[Route]:
    # Operating the durable inbox is an admin's work, as in the admin API.
    return [route("GET", PAGE, inbox_page), route("POST", PAGE + "/retry", retry_action)]
