"""The console's privacy page: export one customer's data as a download, or erase it."""

from __future__ import annotations

import json
from typing import Any

from aiohttp import web

from channels.registry import channel_names
from core.errors import InvalidInput, ParleyError
from core.settings import Settings
from core.store.staff import Role
from gateway.admin.api import erase_customer, export_customer
from gateway.admin.auth import current_staff
from gateway.admin.console.render import (
    CHANNEL_NAMES,
    Route,
    admin,
    agent_of,
    call,
    form,
    page,
    render,
    route,
    text,
    url_with,
    validated,
)
from gateway.admin.schemas import (
    CustomerEraseBody,
    CustomerErasureOut,
    CustomerExportOut,
    CustomerExportQuery,
)
from gateway.middlewares import status_for

_LABELS = {"channel": "Channel", "id": "Customer id"}
PAGE = "/admin/agents/{agent}/privacy"
# Erasing and exporting customers' data is an admin's work, as in the admin API.
ROLE: Role = "admin"


def customer_link(request: web.Request, agent: str, channel: str, customer: str) -> str | None:
    """The privacy page with this customer filled in (``channel`` and ``id`` in its query),
    for staff whose role may use it; None for the others, and for a channel the page does
    not offer (the playground, answer checks)."""
    if not current_staff(request).may(ROLE) or channel not in channel_names():
        return None
    return url_with(PAGE.format(agent=agent), {"channel": channel, "id": customer})


def retention_line(settings: Settings) -> str:
    """What the nightly retention job does, as the settings page says it."""
    days = settings.retention_days
    if not settings.jobs or days == 0 or settings.job_schedules.get("retention") == "off":
        return "Conversations are kept until erased: deleting old ones by age is off."
    return f"Conversations older than {days} days are deleted nightly."


async def _privacy_page(
    request: web.Request,
    *,
    values: dict[str, str],
    error: str | None = None,
    status: int = 200,
    erased: CustomerErasureOut | None = None,
) -> web.Response:
    agent = await agent_of(request)
    audit = await admin(request).customers.audit(agent.slug, limit=20)
    return await render(
        request,
        "admin/privacy.html",
        title=f"Privacy · {agent.name}",
        agent=agent,
        section="privacy",
        error=error,
        status=status,
        values=values,
        channels=[(name, CHANNEL_NAMES.get(name, name)) for name in channel_names()],
        erased=erased,
        audit=audit,
        timezone=agent.timezone,
    )


@page
async def privacy_page(request: web.Request) -> web.StreamResponse:
    values = {"channel": request.query.get("channel", ""), "id": request.query.get("id", "")}
    return await _privacy_page(request, values=values)


@page
async def export_download(request: web.Request) -> web.StreamResponse:
    """The export as a JSON file the browser saves, named for the agent and channel only:
    the file name is shown in download lists, so it carries no customer id."""
    query = validated(
        CustomerExportQuery,
        {k: request.query.get(k, "") for k in ("channel", "id")}
        | {"traces": request.query.get("traces", "false")},
        _LABELS,
    )
    exported = await export_customer(call(request, query=query))
    if not isinstance(exported, CustomerExportOut):
        raise TypeError(f"export_customer gave {type(exported)}")
    body: dict[str, Any] = exported.model_dump(mode="json")
    name = f"parley-{exported.agent}-{exported.channel}-customer-export.json"
    return web.Response(
        text=json.dumps(body, ensure_ascii=False, indent=2),
        content_type="application/json",
        headers={
            "Content-Disposition": f'attachment; filename="{name}"',
            "Cache-Control": "no-store",
            "X-Content-Type-Options": "nosniff",
        },
    )


@page
async def erase_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    values = {"channel": text(data, "channel"), "id": text(data, "id")}
    try:
        body = validated(CustomerEraseBody, values, _LABELS)
        # Typed, not clicked: erasing cannot be undone, so the staff member types the
        # customer id again, and a slip of the mouse erases nothing.
        if text(data, "confirm") != body.id:
            raise InvalidInput(
                "Nothing was erased: type the customer id exactly as above in the confirmation box"
            )
        erased = await erase_customer(call(request, body=body))
        if not isinstance(erased, CustomerErasureOut):
            raise TypeError(f"erase_customer gave {type(erased)}")
    except ParleyError as exc:
        return await _privacy_page(
            request, values=values, error=exc.message, status=status_for(exc)
        )
    return await _privacy_page(
        request, values={"channel": values["channel"], "id": ""}, erased=erased
    )


def routes() -> list[Route]:
    return [
        route("GET", PAGE, privacy_page, role=ROLE),
        route("GET", PAGE + "/export", export_download, role=ROLE),
        route("POST", PAGE + "/erase", erase_action, role=ROLE),
    ]
