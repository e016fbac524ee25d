"""The console's conversation list and conversation page, with the handoff controls."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import UTC, date, datetime, time, timedelta
from typing import Any

from aiohttp import web

from channels.registry import BY_NAME, channel_names
from core.errors import InvalidInput, MediaUnavailable, NotFound, ParleyError
from core.handoff import elapsed
from core.store.agents import Agent
from core.store.handoff import LIVE_CHANNEL
from core.store.transcripts import TurnTrace
from gateway.admin.api import (
    Call,
    conversation_templates,
    hand_back,
    list_conversations,
    path_id,
    send_template,
    staff_reply,
    take_over,
)
from gateway.admin.console.inbox_work import inbox_work_context
from gateway.admin.console.privacy import customer_link
from gateway.admin.console.render import (
    CHANNEL_NAMES,
    Route,
    admin,
    call,
    form,
    page,
    redirect,
    render,
    route,
    run,
    text,
    url_with,
    validated,
    zone,
)
from gateway.admin.inbox_api import mark_read
from gateway.admin.schemas import (
    ConversationPageOut,
    ConversationQuery,
    ConversationTemplatesOut,
    StaffMessageBody,
    TemplateOut,
    TemplateSendBody,
)
from gateway.keys import ANSWERING
from gateway.middlewares import status_for

PAGE_SIZE = 25
FIRST_DAY, LAST_DAY = date(1, 1, 2), date(9999, 12, 30)
LIST = "/admin/conversations"
# Those staff read (every messaging channel of the registry, the widget, the JSON API); trying
# an agent out and the nightly checks make conversations too.
LISTED_CHANNELS = channel_names()


def _day(value: str, name: str) -> date | None:
    if not value:
        return None
    try:
        day = date.fromisoformat(value)
    except ValueError:
        raise InvalidInput(f"{name}: {value!r} is not a date such as 2024-05-31") from None
    # A day at the very ends of the calendar has no start (or next day) in every time zone.
    if not FIRST_DAY <= day <= LAST_DAY:
        raise InvalidInput(f"{name}: give a day from {FIRST_DAY} to {LAST_DAY}")
    return day


def _filter_zone(agents: list[Agent], chosen: Agent | None) -> str:
    """Dates in the filter are days in this zone: the agent's, or the one all agents share."""
    if chosen is not None:
        return chosen.timezone
    zones = {a.timezone for a in agents}
    return zones.pop() if len(zones) == 1 else "UTC"


@page
async def conversation_list(request: web.Request) -> web.StreamResponse:
    query = request.query
    agents = await admin(request).agents.list()
    slug = query.get("agent", "")
    chosen = next((a for a in agents if a.slug == slug), None)
    if slug and chosen is None:
        raise InvalidInput(f"agent: there is no agent {slug!r}")
    channel = query.get("channel", "")
    if channel and channel not in LISTED_CHANNELS:
        raise InvalidInput(f"channel: {channel!r} is not a channel")
    timezone = _filter_zone(agents, chosen)
    first, last = _day(query.get("from", ""), "from"), _day(query.get("to", ""), "to")
    filters: dict[str, Any] = {
        "agent": slug,
        "channel": channel,
        "low_confidence": query.get("low_confidence") == "1",
        "waiting": query.get("waiting") == "1",
        "from": query.get("from", ""),
        "to": query.get("to", ""),
        "q": query.get("q", "").strip(),
        "status": query.get("status", ""),
        "view": query.get("view", ""),
        "label": query.get("label", "").strip(),
    }
    local = zone(timezone)
    wanted = validated(
        ConversationQuery,
        {
            "agent": slug or None,
            "channel": channel or None,
            "low_confidence": filters["low_confidence"],
            "waiting": filters["waiting"],
            "since": datetime.combine(first, time(), local) if first else None,
            "until": datetime.combine(last + timedelta(days=1), time(), local) if last else None,
            "cursor": query.get("cursor") or None,
            "limit": PAGE_SIZE,
            "search": filters["q"] or None,
            "inbox_status": filters["status"] or None,
            "view": filters["view"] or "all",
            "label": filters["label"] or None,
        },
        {"search": "Search", "inbox_status": "Status", "view": "View", "label": "Label"},
    )
    # Read before the list, so a change while it is read shows at the next look.
    version = await admin(request).inbox_work.watermark()
    result = await run(list_conversations, request, ConversationPageOut, query=wanted)
    zones = {a.slug: a.timezone for a in agents}
    return await render(
        request,
        "admin/conversations.html",
        title="Conversations",
        agent=chosen,
        section="conversations",
        rows=result.items,
        version=version,
        labels=await admin(request).inbox_work.labels_in_use(),
        zones=zones,
        filters=filters,
        filter_zone=timezone,
        # Agents in different zones: the filter counts UTC days, each row its agent's time.
        mixed_zones=chosen is None and len({a.timezone for a in agents}) > 1,
        channels=LISTED_CHANNELS,
        older=url_with(LIST, {**filters, "cursor": result.next_cursor})
        if result.next_cursor
        else None,
        newest=url_with(LIST, filters) if query.get("cursor") else None,
    )


def _conversation_id(request: web.Request) -> int:
    return path_id(request)


def _previews(templates: list[TemplateOut], chosen: str, values: list[str]) -> dict[str, str]:
    """Each template's text as the customer would read it: the chosen one filled in with the
    values given so far (a placeholder stays until its value is given), the others as they
    are. The page's script does the same while staff type."""
    previews = {}
    for t in templates:
        text = t.text
        for number, value in enumerate(values if t.name == chosen else [], start=1):
            if value:
                text = text.replace("{{" + str(number) + "}}", value)
        previews[t.name] = text
    return previews


async def _conversation_page(
    request: web.Request,
    *,
    error: str | None = None,
    status: int = 200,
    draft: str = "",
    chosen: str = "",
    values: list[str] | None = None,
) -> web.Response:
    detail = await admin(request).transcripts.get(_conversation_id(request))
    agent = await admin(request).agents.get(detail.conversation.agent)
    work = await inbox_work_context(request, detail.conversation.agent)
    traces: dict[int, TurnTrace] = {t.id: t for t in detail.turns}
    channel = detail.conversation.channel
    templates = await run(conversation_templates, request, ConversationTemplatesOut)
    window = templates.window
    wrote = window.customer_wrote_at if window is not None else None
    values = values or []
    return await render(
        request,
        "admin/conversation.html",
        title=f"Conversation with {detail.conversation.customer}",
        agent=agent,
        section="conversations",
        status=status,
        error=error,
        detail=detail,
        c=detail.conversation,
        traces=traces,
        timezone=agent.timezone,
        # Staff write to the widget live, and through a messaging channel by sending.
        reachable=channel in BY_NAME or channel == LIVE_CHANNEL,
        sent_by_outbox=channel in BY_NAME,
        channel_name=CHANNEL_NAMES.get(channel, channel),
        draft=draft,
        window=window,
        since_customer_wrote=elapsed(datetime.now(UTC) - wrote) if wrote else "",
        templates=templates.items,
        chosen=chosen,
        values=values,
        previews=_previews(templates.items, chosen, values),
        privacy_link=customer_link(
            request, agent.slug, channel, detail.conversation.conversation_key
        ),
        **work,
    )


@page
async def conversation_page(request: web.Request) -> web.StreamResponse:
    await mark_read(call(request))
    return await _conversation_page(request)


async def show_with_error(request: web.Request, error: str, status: int) -> web.Response:
    """The conversation page after a form failed, saying why."""
    return await _conversation_page(request, error=error, status=status)


@page
async def voice_note(request: web.Request) -> web.StreamResponse:
    """A customer's voice note, fetched from their channel with the agent's credentials, so
    staff can listen beside its transcript (the provider's own link needs those). Fetched
    the one way the worker fetches it (`gateway.voice.VoiceNotes.download`, through the
    outbound guard): a link that now leads to a private address, or to a page instead of
    media, is a 404 and nothing of it is shown."""
    detail = await admin(request).transcripts.get(_conversation_id(request))
    turn_id, number = int(request.match_info["turn"]), int(request.match_info["n"])
    turn = next((t for t in detail.turns if t.id == turn_id), None)
    notes = turn.trace.get("voice") if turn is not None else None
    channel = detail.conversation.channel
    if channel not in BY_NAME or not isinstance(notes, list) or number >= len(notes):
        raise NotFound("no such voice note in this conversation")
    agent = await admin(request).agents.get(detail.conversation.agent)
    try:
        data, kind = await request.app[ANSWERING].voice.download(
            agent, channel, str(notes[number].get("media", ""))
        )
    except MediaUnavailable as exc:
        if exc.transient:
            raise
        raise NotFound("this voice note can no longer be fetched") from None
    kind = kind.split(";")[0].strip().lower()
    headers = {"Cache-Control": "private, no-store", "X-Content-Type-Options": "nosniff"}
    if not kind.startswith("audio/"):
        # Played only as audio: anything else is offered as a download, never rendered.
        kind, headers["Content-Disposition"] = "application/octet-stream", "attachment"
    return web.Response(body=data, content_type=kind, headers=headers)


async def _handoff(
    request: web.Request, action: Callable[[Call], Awaitable[object]], done: str, anchor: str = ""
) -> web.StreamResponse:
    try:
        await action(call(request))
    except ParleyError as exc:
        return await _conversation_page(request, error=exc.message, status=status_for(exc))
    raise redirect(f"{LIST}/{_conversation_id(request)}", done, anchor)


@page
async def take_over_action(request: web.Request) -> web.StreamResponse:
    return await _handoff(request, take_over, "taken-over", "reply")


@page
async def hand_back_action(request: web.Request) -> web.StreamResponse:
    return await _handoff(request, hand_back, "handed-back")


@page
async def reply_action(request: web.Request) -> web.StreamResponse:
    draft = text(await form(request), "text")
    try:
        body = validated(StaffMessageBody, {"text": draft}, {"text": "Reply"})
        await staff_reply(call(request, body=body))
    except ParleyError as exc:
        return await _conversation_page(
            request, error=exc.message, status=status_for(exc), draft=draft
        )
    raise redirect(f"{LIST}/{_conversation_id(request)}", "replied", "reply")


@page
async def template_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    name = text(data, "name")
    values = [v.strip() for v in data.getall("values", []) if isinstance(v, str)]
    try:
        labels = {
            "name": "Template",
            **{f"values.{i}": f"Value for {{{{{i + 1}}}}}" for i in range(len(values))},
        }
        body = validated(TemplateSendBody, {"name": name, "values": values}, labels)
        await send_template(call(request, body=body))
    except ParleyError as exc:
        return await _conversation_page(
            request, error=exc.message, status=status_for(exc), chosen=name, values=values
        )
    raise redirect(f"{LIST}/{_conversation_id(request)}", "template-sent", "reply")


async def home(request: web.Request) -> web.StreamResponse:
    raise web.HTTPSeeOther(LIST)


def routes() -> list[Route]:
    one = LIST + r"/{id:\d+}"
    return [
        route("GET", "/admin", home, role="agent"),
        route("GET", LIST, conversation_list, role="agent"),
        route("GET", one, conversation_page, role="agent"),
        route("GET", one + r"/voice/{turn:\d+}/{n:\d+}", voice_note, role="agent"),
        route("POST", one + "/take-over", take_over_action, role="agent"),
        route("POST", one + "/hand-back", hand_back_action, role="agent"),
        route("POST", one + "/reply", reply_action, role="agent"),
        route("POST", one + "/template", template_action, role="agent"),
    ]
