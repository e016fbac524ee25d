"""The admin JSON API under /api/v1/admin: agents, conversations, gaps, sources, curated
answers, answer checks, staff and the playground.

Each route is declared once, with the pydantic models of its query, body and response, and
the staff role it needs (admin unless it says agent); the wrapper checks the role first,
then validates with those very models, and the OpenAPI document is generated from them.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any
from zoneinfo import ZoneInfo

from aiohttp import web
from pydantic import BaseModel, ValidationError

from channels.base import Channel
from channels.credentials import OPTION_KEYS, own_credentials
from channels.registry import BY_NAME, CHANNEL_TITLES, CHANNELS, channel_names
from channels.web import WRITING_RULE, SseTurnOutput, parse_body
from core.answer.escalation import validate_handoff_settings
from core.delivery import Template
from core.errors import Conflict, InvalidInput, NotFound
from core.feedback import SETTING as FEEDBACK_PROMPT
from core.feedback import asks_for_feedback, validate_feedback_settings
from core.inbound import InboundMessage
from core.knowledge.sources import SourceSpec
from core.llm.limits import validate_llm_limits
from core.store.agents import Agent
from core.store.database import MAX_ID
from core.store.privacy import Customer
from core.store.reports import Figures, period_bounds
from core.store.staff import Role
from core.store.transcripts import ConversationFilter
from core.tags import (
    CHANNEL_FILTERS,
    EXCLUDE_TAGS,
    INCLUDE_TAGS,
    TAG_RULES,
    TAG_SETTINGS,
    channel_filters,
    tag_rules,
)
from core.turns import TurnEvent, TurnRequest
from gateway.admin import schemas as s
from gateway.admin.auth import DEVICE_COOKIE, STAFF, Staff
from gateway.admin.events import PLAYGROUND_EVENTS, Events
from gateway.admin.guard import API_PREFIX
from gateway.admin.services import AdminServices
from gateway.client_address import client_address
from gateway.keys import ADMIN, SETTINGS, WEB_CHANNEL

Reply = BaseModel | web.StreamResponse | None


@dataclass
class Call:
    """One request to an operation, with its query and body already validated."""

    request: web.Request
    admin: AdminServices
    body: Any = None
    query: Any = None
    _on_response: list[Callable[[web.StreamResponse], None]] = field(default_factory=list)

    @property
    def staff(self) -> Staff:
        return self.request[STAFF]

    def id(self, name: str = "id") -> int:
        return path_id(self.request, name)

    async def agent(self) -> Agent:
        return await self.admin.agents.get(self.request.match_info["agent"])

    async def conversation(self) -> int:
        """The path's conversation id, once it is known to exist (else 404)."""
        conversation_id = self.id()
        await self.admin.transcripts.row(conversation_id)
        return conversation_id

    def on_response(self, change: Callable[[web.StreamResponse], None]) -> None:
        """Adjust the response once it exists (cookies)."""
        self._on_response.append(change)


def path_id(request: web.Request, name: str = "id") -> int:
    """An id from the path, whose route lets only digits through. One no row can have (0, or
    beyond a bigint) is not found, rather than a query PostgreSQL's driver refuses to send."""
    raw = request.match_info[name]
    digits = raw.lstrip("0")
    if not digits or len(digits) > len(str(MAX_ID)) or int(digits) > MAX_ID:
        raise NotFound(f"{name}: there is nothing with the id {raw[:40]}")
    return int(digits)


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # under /api/v1/admin, as an aiohttp route template
    handler: Callable[[Call], Awaitable[Reply]]
    summary: str
    tag: str
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    response: type[BaseModel] | None = None
    status: int = 200
    stream: bool = False  # text/event-stream instead of JSON
    events: Events = ()  # what the stream sends: each event's name and data
    public: bool = False  # reachable without signing in
    # The staff role it needs: "admin" (the default, so a new route is closed to agents until
    # it says otherwise) or "agent" (any signed-in staff). Not checked when ``public``.
    role: Role = "admin"
    signs_in: bool = False  # sets the session cookie: JSON from this gateway's pages only

    @property
    def route(self) -> str:
        return API_PREFIX + self.path

    @property
    def name(self) -> str:
        return self.handler.__name__


OPERATIONS: list[Operation] = []


def operation(
    method: str, path: str, summary: str, tag: str, **options: Any
) -> Callable[[Callable[[Call], Awaitable[Reply]]], Callable[[Call], Awaitable[Reply]]]:
    def register(handler: Callable[[Call], Awaitable[Reply]]) -> Callable[[Call], Awaitable[Reply]]:
        OPERATIONS.append(Operation(method, path, handler, summary, tag, **options))
        return handler

    return register


def parse_query(request: web.Request, model: type[BaseModel]) -> Any:
    try:
        return model.model_validate(dict(request.query))
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"]) or "query"
        raise InvalidInput(f"{where}: {problem['msg']}") from None


def _handler(op: Operation) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    async def handle(request: web.Request) -> web.StreamResponse:
        call = Call(request, request.app[ADMIN])
        if not op.public:
            # Before the query and body are read: a refusal says nothing about them.
            call.staff.require(op.role, f"{op.method} {op.route}")
        if op.signs_in:
            call.admin.auth.check_sign_in_request(request)
        if op.query is not None:
            call.query = parse_query(request, op.query)
        if op.body is not None:
            call.body = parse_body(await request.read(), op.body)
        result = await op.handler(call)
        if isinstance(result, web.StreamResponse):
            return result
        if result is None:
            response = web.Response(status=204)
        else:
            # What is sent must be what the OpenAPI document says is sent.
            if op.response is None or not isinstance(result, op.response):
                raise TypeError(f"{op.name} returned {type(result).__name__}")
            response = web.json_response(result.model_dump(mode="json"), status=op.status)
        for change in call._on_response:
            change(response)
        return response

    handle.__name__ = op.name
    return handle


def admin_routes() -> list[web.RouteDef]:
    return [web.route(op.method, op.route, _handler(op)) for op in OPERATIONS]


# -- sign-in --------------------------------------------------------------------------------


def _session(staff: Staff, expires_at: Any = None) -> s.SessionOut:
    return s.SessionOut(
        staff=s.StaffOut(
            id=staff.id, email=staff.email, name=staff.name, via=staff.via, role=staff.role
        ),
        csrf_token=staff.csrf_token,
        expires_at=expires_at,
    )


@operation(
    "POST",
    "/sign-in",
    "Sign in; sets the session cookie",
    "session",
    body=s.SignInBody,
    response=s.SessionOut,
    public=True,
    signs_in=True,
)
async def sign_in(call: Call) -> s.SessionOut:
    body: s.SignInBody = call.body
    auth = call.admin.auth
    signed_in = await auth.sign_in(
        address=client_address(call.request),
        token=body.token,
        email=body.email,
        password=body.password,
        device=call.request.cookies.get(DEVICE_COOKIE),
    )
    call.on_response(lambda response: auth.set_cookie(response, signed_in))
    return _session(signed_in.staff, signed_in.expires_at)


@operation("POST", "/sign-out", "Sign out; ends the session", "session", status=204, role="agent")
async def sign_out(call: Call) -> None:
    auth = call.admin.auth
    await auth.sign_out(call.request)
    call.on_response(auth.clear_cookie)


@operation(
    "GET",
    "/me",
    "Who is signed in, with which role, and the session's CSRF token",
    "session",
    response=s.SessionOut,
    role="agent",
)
async def me(call: Call) -> s.SessionOut:
    return _session(call.staff)


@operation("GET", "/staff", "Staff accounts", "staff", response=s.StaffList)
async def list_staff(call: Call) -> s.StaffList:
    return s.StaffList.model_validate({"items": await call.admin.staff.list()})


@operation(
    "PATCH",
    r"/staff/{id:\d+}",
    "Change a staff account's role, or disable or enable it",
    "staff",
    body=s.StaffPatch,
    response=s.StaffMemberOut,
)
async def patch_staff(call: Call) -> s.StaffMemberOut:
    """No account changes its own role, and the last enabled admin account can be neither
    made an agent nor disabled (409): someone must be left who can manage the accounts."""
    body: s.StaffPatch = call.body
    staff_id = call.id()
    accounts = call.admin.staff
    member = await accounts.get(staff_id)
    if body.role is not None and body.role != member.role:
        if staff_id == call.staff.id:
            raise Conflict("you cannot change your own role; another admin can")
        member = await accounts.set_role(staff_id, body.role)
    if body.disabled is not None and body.disabled != member.disabled:
        member = await accounts.set_disabled(staff_id, body.disabled)
    return s.StaffMemberOut.model_validate(member)


# -- agents ---------------------------------------------------------------------------------

_HANDOFF_SETTINGS = ("business_hours", "handoff_enabled", "handoff_text", "out_of_hours_text")
# Settings with a field of their own, besides handoff's: not repeated among the others.
_NAMED_SETTINGS = (*_HANDOFF_SETTINGS, FEEDBACK_PROMPT, *TAG_SETTINGS)
_COLUMNS = (
    "name",
    "persona",
    "custom_prompt",
    "default_language",
    "timezone",
    "confidence_threshold",
    "contact_route",
    "allowed_origins",
)


def _block(settings: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    block = settings.get(name)
    return block if isinstance(block, Mapping) else {}


def _channel_out(channel: Channel, agent: Agent) -> BaseModel:
    """A channel's block as its declaration says to show it: secrets only as whether set."""
    settings = agent.settings
    block = _block(settings, channel.block)
    shown: dict[str, Any] = {
        "configured": own_credentials(block) if channel.block in settings else False
    }
    if channel.customer_window_hours is not None:
        shown["templates"] = [
            s.ChannelTemplateOut.model_validate(t) for t in channel.templates(agent)
        ]
    for spec in channel.credential_fields:
        value = block.get(spec.name)
        if spec.secret:
            shown[f"{spec.name}_set"] = bool(value)
        else:
            shown[spec.name] = value if isinstance(value, str) else None
    return s.CHANNEL_OUT[channel.block](**shown)


def agent_out(agent: Agent) -> s.AgentOut:
    """An agent as staff see it: channel secrets reduced to whether they are set."""
    settings = agent.settings
    blocks = {c.block for c in CHANNELS}
    return s.AgentOut(
        slug=agent.slug,
        name=agent.name,
        default_language=agent.default_language,
        timezone=agent.timezone,
        persona=agent.persona,
        custom_prompt=agent.custom_prompt,
        confidence_threshold=agent.confidence_threshold,
        contact_route=agent.contact_route,
        widget_key=agent.widget_key,
        allowed_origins=list(agent.allowed_origins),
        business_hours=settings.get("business_hours") or None,
        handoff_enabled=settings.get("handoff_enabled", True) is not False,
        handoff_text=settings.get("handoff_text") or None,
        out_of_hours_text=settings.get("out_of_hours_text") or None,
        feedback_prompt=asks_for_feedback(settings),
        **_tag_settings_out(settings),
        settings={
            k: v for k, v in settings.items() if k not in blocks and k not in _NAMED_SETTINGS
        },
        channels=s.ChannelsOut(**{c.block: _channel_out(c, agent) for c in CHANNELS}),
        embedder=agent.embedder,
        embedding_dim=agent.embedding_dim,
        knowledge_version=agent.knowledge_version,
        created_at=agent.created_at,
    )


def _tag_settings_out(settings: Mapping[str, Any]) -> dict[str, Any]:
    """The agent's tag filters and URL rules as AgentOut shows them."""
    lists = {
        key: [str(t) for t in value] if isinstance(value := settings.get(key), list) else []
        for key in (INCLUDE_TAGS, EXCLUDE_TAGS)
    }
    try:
        rules = list(tag_rules(settings.get(TAG_RULES)))
    except InvalidInput:
        rules = []  # not set through this API, and not in a shape it would take
    filters = {c.name: channel_filters(settings, c.name) for c in CHANNELS}
    return {
        **lists,
        TAG_RULES: rules,
        CHANNEL_FILTERS: {n: f for n, f in filters.items() if f.include_tags or f.exclude_tags},
    }


def _patch_tag_settings(settings: dict[str, Any], body: s.AgentPatch) -> None:
    """The tag filters and URL rules the body gives, stored as the pipeline and the SQL that
    tags pages read them; an empty one is not stored."""
    given = body.model_fields_set
    for key in (INCLUDE_TAGS, EXCLUDE_TAGS):
        if key in given:
            settings[key] = list(getattr(body, key) or [])
    if TAG_RULES in given:
        settings[TAG_RULES] = [rule.model_dump() for rule in body.tag_rules or []]
    if CHANNEL_FILTERS in given:
        settings[CHANNEL_FILTERS] = {
            name: f.model_dump()
            for name, f in (body.channel_filters or {}).items()
            if f.include_tags or f.exclude_tags
        }
    for key in TAG_SETTINGS:
        if key in settings and not settings[key]:
            del settings[key]


def _patched_settings(agent: Agent, body: s.AgentPatch) -> dict[str, Any]:
    settings = dict(agent.settings)
    _patch_tag_settings(settings, body)
    given = body.model_fields_set
    for key in _HANDOFF_SETTINGS:
        if key in given:
            value = getattr(body, key)
            if value is None:
                settings.pop(key, None)
            else:
                settings[key] = value
    if FEEDBACK_PROMPT in given:
        # Off is the default: only "on" is stored.
        if body.feedback_prompt:
            settings[FEEDBACK_PROMPT] = True
        else:
            settings.pop(FEEDBACK_PROMPT, None)
    for key, value in (body.settings or {}).items():
        if value is None:
            settings.pop(key, None)
        else:
            settings[key] = value
    channels = body.channels
    for channel in CHANNELS:
        name = channel.block
        if channels is None or name not in channels.model_fields_set:
            continue
        patch: BaseModel | None = getattr(channels, name)
        block = dict(_block(settings, name))
        if patch is None:
            # The agent's own credentials go; its options (templates) are not credentials.
            block = {k: v for k, v in block.items() if k in OPTION_KEYS}
        else:
            for key in patch.model_fields_set:
                value = getattr(patch, key)
                if key == "templates":
                    value = [t.model_dump() for t in value] if value else None
                if value is None:
                    block.pop(key, None)
                else:
                    block[key] = value
        if block or (patch is not None and patch.model_fields_set != {"templates"}):
            settings[name] = block
        else:
            settings.pop(name, None)  # nothing of the agent's own is left
    # The channels read a block as a whole: one that cannot verify webhooks is refused now,
    # not at the first message.
    for channel in CHANNELS:
        if channel.block not in settings:
            continue
        stored = _block(settings, channel.block)
        if not own_credentials(stored):
            continue  # templates only: the environment's credentials apply
        for spec in channel.credential_fields:
            if spec.required and not stored.get(spec.name):
                raise InvalidInput(
                    f"channels.{channel.block}.{spec.name}: {spec.label} is required while "
                    f"the agent has {channel.title} credentials of its own"
                )
    validate_handoff_settings(settings)
    validate_feedback_settings(settings)
    validate_llm_limits(settings)
    return settings


@operation("GET", "/agents", "Agents", "agents", response=s.AgentList, role="agent")
async def list_agents(call: Call) -> s.AgentList:
    return s.AgentList(items=[agent_out(a) for a in await call.admin.agents.list()])


@operation(
    "GET", "/agents/{agent}", "One agent's settings", "agents", response=s.AgentOut, role="agent"
)
async def get_agent(call: Call) -> s.AgentOut:
    return agent_out(await call.agent())


@operation(
    "PATCH",
    "/agents/{agent}",
    "Change an agent's settings",
    "agents",
    body=s.AgentPatch,
    response=s.AgentOut,
)
async def patch_agent(call: Call) -> s.AgentOut:
    body: s.AgentPatch = call.body
    agent = await call.agent()
    changes: dict[str, Any] = {}
    for column in _COLUMNS:
        if column in body.model_fields_set:
            value = getattr(body, column)
            if value is None:
                raise InvalidInput(f"{column}: may not be null")
            changes[column] = value
    settings = _patched_settings(agent, body)
    if settings != agent.settings:
        changes["settings"] = settings
    changed = await call.admin.agents.update(agent.slug, **changes)
    rules_changed = changed.settings.get(TAG_RULES) != agent.settings.get(TAG_RULES)
    # The stored pages and their chunks carry the new rules' tags at once.
    if rules_changed and await call.admin.sources.retag(changed):
        changed = await call.agent()  # with the knowledge version that moved
    return agent_out(changed)


@operation(
    "POST", "/agents/{agent}/widget-key", "Replace the widget key", "agents", response=s.AgentOut
)
async def rotate_widget_key(call: Call) -> s.AgentOut:
    return agent_out(await call.admin.agents.rotate_widget_key(call.request.match_info["agent"]))


# -- conversations --------------------------------------------------------------------------


@operation(
    "GET",
    "/conversations",
    "Conversations of every agent and channel, newest first",
    "conversations",
    query=s.ConversationQuery,
    response=s.ConversationPageOut,
    role="agent",
)
async def list_conversations(call: Call) -> s.ConversationPageOut:
    query: s.ConversationQuery = call.query
    if query.agent is not None:
        await call.admin.agents.get(query.agent)
    wanted = query.model_dump(exclude={"view"})
    wanted["assignee_id"] = call.staff.id if query.view == "mine" else None
    if query.view == "mine" and call.staff.id is None:
        wanted["assignee_id"] = 0  # the admin token is no account: nothing is assigned to it
    page = await call.admin.transcripts.list(
        ConversationFilter(**wanted, unassigned=query.view == "unassigned")
    )
    return s.ConversationPageOut.model_validate(page)


@operation(
    "GET",
    r"/conversations/{id:\d+}",
    "A conversation: summary, transcript, traces",
    "conversations",
    response=s.ConversationDetailOut,
    role="agent",
)
async def get_conversation(call: Call) -> s.ConversationDetailOut:
    conversation_id = call.id()
    detail = s.ConversationDetailOut.model_validate(
        await call.admin.transcripts.get(conversation_id)
    )
    window = await _window(call, conversation_id)
    return detail.model_copy(update={"window": window})


async def _window(call: Call, conversation_id: int) -> s.WindowOut | None:
    """The conversation's customer window as of now (None: its channel has none)."""
    handoff = call.admin.handoff
    window = handoff.window(await handoff.state(conversation_id))
    if window is None:
        return None
    return s.WindowOut(
        hours=window.hours,
        open=window.open,
        customer_wrote_at=window.customer_wrote_at,
        closes_at=window.closes_at if window.open else None,
        closed_at=None if window.open else window.closes_at,
    )


async def _templates(call: Call, conversation_id: int) -> tuple[str, list[Template]]:
    """The conversation's channel, and the agent's approved templates for it."""
    row = await call.admin.transcripts.row(conversation_id)
    channel = BY_NAME.get(row.channel)
    if channel is None:
        return row.channel, []
    return row.channel, channel.templates(await call.admin.agents.get(row.agent))


# -- handoff --------------------------------------------------------------------------------


@operation(
    "POST",
    r"/conversations/{id:\d+}/takeover",
    "Take a conversation over: the bot pauses until handed back",
    "conversations",
    response=s.ConversationOut,
    role="agent",
)
async def take_over(call: Call) -> s.ConversationOut:
    conversation_id = await call.conversation()
    await call.admin.handoff.take_over(conversation_id, call.staff.label)
    return s.ConversationOut.model_validate(await call.admin.transcripts.row(conversation_id))


@operation(
    "POST",
    r"/conversations/{id:\d+}/handback",
    "Hand a conversation back to the bot",
    "conversations",
    response=s.ConversationOut,
    role="agent",
)
async def hand_back(call: Call) -> s.ConversationOut:
    conversation_id = await call.conversation()
    await call.admin.handoff.hand_back(conversation_id)
    return s.ConversationOut.model_validate(await call.admin.transcripts.row(conversation_id))


@operation(
    "POST",
    r"/conversations/{id:\d+}/messages",
    "Reply as staff, through the conversation's own channel (takes it over)",
    "conversations",
    body=s.StaffMessageBody,
    response=s.StaffMessageOut,
    status=201,
    role="agent",
)
async def staff_reply(call: Call) -> s.StaffMessageOut:
    body: s.StaffMessageBody = call.body
    conversation_id = await call.conversation()
    message_id = await call.admin.handoff.reply(conversation_id, body.text, call.staff.label)
    return s.StaffMessageOut(message_id=message_id)


@operation(
    "GET",
    r"/conversations/{id:\d+}/templates",
    "The approved templates staff may send in a conversation, and its customer window",
    "conversations",
    response=s.ConversationTemplatesOut,
    role="agent",
)
async def conversation_templates(call: Call) -> s.ConversationTemplatesOut:
    """The agent's templates for the conversation's channel (none for a channel without a
    customer window). Once the window has closed (WhatsApp: 24 hours after the customer's
    last message) only these reach the customer; free text is refused (409)."""
    conversation_id = call.id()
    channel, templates = await _templates(call, conversation_id)
    return s.ConversationTemplatesOut(
        channel=channel,
        items=[
            s.TemplateOut(
                name=t.name,
                provider_id=t.provider_id,
                language=t.language,
                text=t.text,
                variables=t.variables,
            )
            for t in templates
        ],
        window=await _window(call, conversation_id),
    )


@operation(
    "POST",
    r"/conversations/{id:\d+}/templates",
    "Send an approved template as staff (takes the conversation over)",
    "conversations",
    body=s.TemplateSendBody,
    response=s.StaffMessageOut,
    status=201,
    role="agent",
)
async def send_template(call: Call) -> s.StaffMessageOut:
    """The template's text, filled in with ``values``, is stored as the staff message (the
    bot's memory reads it); the channel is sent the template itself. An unknown name, or
    another number of values than the template's placeholders, is a 400."""
    body: s.TemplateSendBody = call.body
    conversation_id = call.id()
    channel, templates = await _templates(call, conversation_id)
    template = next((t for t in templates if t.name == body.name), None)
    if template is None:
        known = ", ".join(t.name for t in templates) or "none"
        raise InvalidInput(
            f"name: the agent has no {channel} template {body.name!r} (it has: {known})"
        )
    message_id = await call.admin.handoff.send_template(
        conversation_id, template, body.values, call.staff.label
    )
    return s.StaffMessageOut(message_id=message_id)


# -- the inbox ------------------------------------------------------------------------------


@operation(
    "GET",
    "/inbox",
    "Messages of the messaging channels that failed, or wait too long for their answer",
    "inbox",
    query=s.InboxQuery,
    response=s.InboxList,
)
async def list_inbox(call: Call) -> s.InboxList:
    """Newest first. A stuck message failed a try and waits to be tried again (a service
    was down), or has waited longer than the holding delay; a failed one was given up on."""
    query: s.InboxQuery = call.query
    agent_id = (await call.admin.agents.get(query.agent)).id if query.agent else None
    rows = await call.admin.inbox.troubled(
        stuck_after=call.admin.inbox_stuck_after,
        failed=query.state != "stuck",
        stuck=query.state != "failed",
        agent_id=agent_id,
        limit=query.limit,
    )
    items = [
        s.InboxMessageOut(
            id=row.id,
            agent=row.agent,
            channel=row.channel,
            customer=row.conversation_key,
            conversation_id=row.conversation_id,
            text=InboundMessage.from_json(row.message).text,
            status=row.status,  # type: ignore[arg-type]  # only open or failed rows are listed
            attempts=row.attempts,
            error=row.error,
            received_at=row.received_at,
            next_attempt_at=row.next_attempt_at if row.status == "pending" else None,
            holding_sent_at=row.holding_sent_at,
            failed_at=row.processed_at if row.status == "failed" else None,
        )
        for row in rows
    ]
    return s.InboxList(items=items, stuck_after_seconds=call.admin.inbox_stuck_after)


@operation(
    "POST",
    "/inbox/retry",
    "Answer failed messages, or those waiting to be tried again, now",
    "inbox",
    body=s.InboxRetryBody,
    response=s.InboxRetriedOut,
)
async def retry_inbox(call: Call) -> s.InboxRetriedOut:
    body: s.InboxRetryBody = call.body
    return s.InboxRetriedOut(retried=await call.admin.inbox.retry(body.ids))


# -- notifications --------------------------------------------------------------------------


@operation(
    "GET",
    "/notifications",
    "Customers who asked for a person or waited too long, and the webhook's deliveries",
    "notifications",
    query=s.NotificationQuery,
    response=s.NotificationList,
)
async def list_notifications(call: Call) -> s.NotificationList:
    """Newest first; each event is also one delivery to PARLEY_NOTIFY_WEBHOOK (README:
    "Being told"), with its attempts so far."""
    query: s.NotificationQuery = call.query
    rows = await call.admin.notifications.recent(query.limit)
    items = [
        s.NotificationOut(
            id=r.id,
            type=r.type,  # type: ignore[arg-type]  # the table's CHECK allows only these
            agent=r.agent,
            channel=r.channel,
            conversation_id=r.conversation_id,
            customer=r.customer,
            waiting_since=r.waiting_since,
            created_at=r.created_at,
            status=r.status,  # type: ignore[arg-type]
            attempts=r.attempts,
            last_status_code=r.last_status_code,
            last_error=r.last_error,
            next_attempt_at=r.next_attempt_at if r.status == "pending" else None,
            delivered_at=r.delivered_at,
        )
        for r in rows
    ]
    webhook = call.request.app[SETTINGS].notify_webhook is not None
    return s.NotificationList(items=items, webhook=webhook)


# -- privacy requests -----------------------------------------------------------------------


@operation(
    "POST",
    "/agents/{agent}/customers/erase",
    "Erase one customer's data on a channel: conversations, messages, summaries, traces, "
    "content gaps, feedback, inbox and outbox rows and cached memory (audited by a keyed hash)",
    "privacy",
    body=s.CustomerEraseBody,
    response=s.CustomerErasureOut,
)
async def erase_customer(call: Call) -> s.CustomerErasureOut:
    body: s.CustomerEraseBody = call.body
    agent = await call.agent()
    customer = Customer(agent.id, agent.slug, body.channel, body.id)
    erasure = await call.admin.customers.erase(customer, staff=call.staff.label)
    return s.CustomerErasureOut(
        agent=agent.slug,
        channel=body.channel,
        erased=s.ErasedOut.model_validate(erasure.erased),
        cached_memory_forgotten=len(erasure.conversation_ids),
        audit_customer_hash=erasure.customer_hash,
    )


@operation(
    "GET",
    "/agents/{agent}/customers/export",
    "Export one customer's conversations on a channel as JSON (audited by a keyed hash)",
    "privacy",
    query=s.CustomerExportQuery,
    response=s.CustomerExportOut,
)
async def export_customer(call: Call) -> s.CustomerExportOut:
    query: s.CustomerExportQuery = call.query
    agent = await call.agent()
    customer = Customer(agent.id, agent.slug, query.channel, query.id)
    conversations = await call.admin.customers.export(
        customer, staff=call.staff.label, traces=query.traces
    )
    return s.CustomerExportOut(
        agent=agent.slug,
        channel=query.channel,
        customer=query.id,
        exported_at=datetime.now(UTC),
        conversations=[s.ExportedConversationOut.model_validate(c) for c in conversations],
    )


# -- content gaps ---------------------------------------------------------------------------


@operation(
    "GET",
    "/agents/{agent}/gaps",
    "Open content gaps, grouped by similar question",
    "gaps",
    response=s.GapList,
    role="agent",
)
async def list_gaps(call: Call) -> s.GapList:
    agent = await call.agent()
    groups = await call.admin.gaps.grouped(agent.id, call.admin.embedder)
    return s.GapList(items=[s.GapGroupOut.model_validate(g) for g in groups], grouped_by="meaning")


@operation(
    "POST",
    "/agents/{agent}/gaps/resolve",
    "Mark a group of gaps resolved",
    "gaps",
    body=s.ResolveGapsBody,
    response=s.ResolvedOut,
    role="agent",
)
async def resolve_gaps(call: Call) -> s.ResolvedOut:
    body: s.ResolveGapsBody = call.body
    agent = await call.agent()
    return s.ResolvedOut(resolved=await call.admin.gaps.resolve(agent.id, body.gap_ids))


# -- reports --------------------------------------------------------------------------------

TOP_GAPS = 10


@operation(
    "GET",
    "/reports",
    "An agent's figures per day and channel over a period, in the agent's time zone",
    "reports",
    query=s.ReportQuery,
    response=s.ReportOut,
    role="agent",
)
async def get_report(call: Call) -> s.ReportOut:
    query: s.ReportQuery = call.query
    agent = await call.admin.agents.get(query.agent)
    last_day = query.to or datetime.now(ZoneInfo(agent.timezone)).date()
    first_day = query.from_ or last_day - timedelta(days=29)
    if first_day > last_day:
        raise InvalidInput("from is after to")
    if (last_day - first_day).days >= s.MAX_REPORT_DAYS:
        raise InvalidInput(f"a report covers at most {s.MAX_REPORT_DAYS} days")
    report = await call.admin.reports.report(agent.id, agent.timezone, first_day, last_day)
    start, end = period_bounds(first_day, last_day, agent.timezone)
    groups = await call.admin.gaps.grouped(agent.id, call.admin.embedder)
    asked = [g for g in groups if g.last_seen >= start and g.first_seen < end]
    named = {r.channel for r in report.channels if r.channel is not None}
    return s.ReportOut(
        agent=agent.slug,
        timezone=agent.timezone,
        first_day=first_day,
        last_day=last_day,
        channels=[
            s.ReportChannelOut(name=name, title=CHANNEL_TITLES.get(name, name))
            for name in (*channel_names(), *sorted(named - set(channel_names())))
            if name in named
        ],
        days=[_figures_out(f) for f in report.days],
        per_channel=[_figures_out(f) for f in report.channels],
        total=_figures_out(report.total),
        feedback_recorded=report.feedback_recorded,
        gaps=[s.ReportGapOut.model_validate(g) for g in asked[:TOP_GAPS]],
    )


def _figures_out(figures: Figures) -> s.ReportFiguresOut:
    return s.ReportFiguresOut.model_validate(figures)


# -- sources --------------------------------------------------------------------------------


def _source_out(call: Call, record: Any) -> s.SourceOut:
    out = s.SourceOut.model_validate(record)
    return out.model_copy(update={"running": call.admin.sources.running(out.id)})


def _text_url(title: str) -> str:
    slug = re.sub(r"[^a-z0-9]+", "-", title.casefold()).strip("-")[:80]
    return f"/texts/{slug or 'text'}"


@operation(
    "GET",
    "/agents/{agent}/sources",
    "Sources with status, last crawl and errors",
    "sources",
    response=s.SourceList,
)
async def list_sources(call: Call) -> s.SourceList:
    records = await call.admin.sources.list(await call.agent())
    return s.SourceList(items=[_source_out(call, r) for r in records])


@operation(
    "POST",
    "/agents/{agent}/sources",
    "Add a URL, sitemap or text; indexed in the background",
    "sources",
    body=s.SourceBody,
    response=s.SourceOut,
    status=202,
)
async def add_source(call: Call) -> s.SourceOut:
    body: s.SourceBody = call.body
    agent = await call.agent()
    if body.kind == "text":
        text = body.text or ""
        if body.title and not text.lstrip().startswith("# "):
            text = f"# {body.title}\n\n{text}"
        spec = SourceSpec("text", body.url or _text_url(body.title or ""), text)
    else:
        spec = SourceSpec(body.kind, body.url or "")
    return _source_out(call, await call.admin.sources.add(agent, spec, body.tags))


@operation(
    "GET", r"/agents/{agent}/sources/{id:\d+}", "One source", "sources", response=s.SourceOut
)
async def get_source(call: Call) -> s.SourceOut:
    return _source_out(call, await call.admin.sources.get(await call.agent(), call.id()))


@operation(
    "PATCH",
    r"/agents/{agent}/sources/{id:\d+}",
    "Change a source's tags; its pages carry them at once",
    "sources",
    body=s.SourcePatch,
    response=s.SourceOut,
)
async def patch_source(call: Call) -> s.SourceOut:
    body: s.SourcePatch = call.body
    agent = await call.agent()
    return _source_out(call, await call.admin.sources.set_tags(agent, call.id(), body.tags))


@operation(
    "GET",
    r"/agents/{agent}/sources/{id:\d+}/pages",
    "A source's pages with their tags",
    "sources",
    query=s.PageQuery,
    response=s.PageList,
)
async def list_pages(call: Call) -> s.PageList:
    query: s.PageQuery = call.query
    pages = await call.admin.sources.pages(
        await call.agent(), call.id(), after=query.after, limit=query.limit + 1
    )
    shown = pages[: query.limit]
    return s.PageList(
        items=[s.PageOut.model_validate(p) for p in shown],
        next_after=shown[-1].id if len(pages) > query.limit else None,
    )


@operation(
    "PATCH",
    r"/agents/{agent}/pages/{page:\d+}",
    "Change a page's own tags; its chunks carry them at once",
    "sources",
    body=s.PagePatch,
    response=s.PageOut,
)
async def patch_page(call: Call) -> s.PageOut:
    body: s.PagePatch = call.body
    page = await call.admin.sources.tag_page(await call.agent(), call.id("page"), body.own_tags)
    return s.PageOut.model_validate(page)


@operation(
    "POST",
    r"/agents/{agent}/sources/{id:\d+}/reindex",
    "Read a source again, in the background",
    "sources",
    response=s.SourceOut,
    status=202,
)
async def reindex_source(call: Call) -> s.SourceOut:
    return _source_out(call, await call.admin.sources.reindex(await call.agent(), call.id()))


@operation(
    "DELETE",
    r"/agents/{agent}/sources/{id:\d+}",
    "Remove a source and its pages",
    "sources",
    response=s.RemovedOut,
)
async def delete_source(call: Call) -> s.RemovedOut:
    removed = await call.admin.sources.remove(await call.agent(), call.id())
    return s.RemovedOut(pages_removed=removed)


# -- curated answers ------------------------------------------------------------------------


@operation(
    "GET",
    "/agents/{agent}/curated",
    "Curated answers with hit counts",
    "curated",
    response=s.CuratedList,
    role="agent",
)
async def list_curated(call: Call) -> s.CuratedList:
    agent = await call.agent()
    return s.CuratedList.model_validate({"items": await call.admin.curated.list(agent.id)})


@operation(
    "POST",
    "/agents/{agent}/curated",
    "Add a curated answer",
    "curated",
    body=s.CuratedBody,
    response=s.CuratedOut,
    status=201,
    role="agent",
)
async def create_curated(call: Call) -> s.CuratedOut:
    body: s.CuratedBody = call.body
    agent = await call.agent()
    curated = call.admin.curated
    new_id = await curated.create(
        agent.id,
        body.answer,
        question=body.question,
        keywords=tuple(k.strip() for k in body.keywords if k.strip()),
        pattern=body.pattern,
        language=body.language,
    )
    entry = await curated.update(agent.id, new_id, enabled=body.enabled)
    return s.CuratedOut.model_validate(entry)


@operation(
    "GET",
    r"/agents/{agent}/curated/{id:\d+}",
    "One curated answer",
    "curated",
    response=s.CuratedOut,
    role="agent",
)
async def get_curated(call: Call) -> s.CuratedOut:
    agent = await call.agent()
    return s.CuratedOut.model_validate(await call.admin.curated.get(agent.id, call.id()))


@operation(
    "PATCH",
    r"/agents/{agent}/curated/{id:\d+}",
    "Change a curated answer",
    "curated",
    body=s.CuratedPatch,
    response=s.CuratedOut,
    role="agent",
)
async def patch_curated(call: Call) -> s.CuratedOut:
    body: s.CuratedPatch = call.body
    agent = await call.agent()
    changes = {k: getattr(body, k) for k in body.model_fields_set}
    for required in ("answer", "question", "keywords", "enabled"):
        if required in changes and changes[required] is None:
            raise InvalidInput(f"{required}: may not be null")
    entry = await call.admin.curated.update(agent.id, call.id(), **changes)
    if not (entry.question or entry.pattern or entry.keywords):
        raise InvalidInput("a curated answer needs a question, keywords or a pattern")
    return s.CuratedOut.model_validate(entry)


@operation(
    "DELETE",
    r"/agents/{agent}/curated/{id:\d+}",
    "Delete a curated answer",
    "curated",
    status=204,
    role="agent",
)
async def delete_curated(call: Call) -> None:
    agent = await call.agent()
    await call.admin.curated.delete(agent.id, call.id())


# -- answer checks --------------------------------------------------------------------------


@operation(
    "GET",
    "/agents/{agent}/checks",
    "Test questions asked every night",
    "checks",
    response=s.CheckList,
    role="agent",
)
async def list_checks(call: Call) -> s.CheckList:
    agent = await call.agent()
    return s.CheckList.model_validate({"items": await call.admin.checks.list(agent.id)})


@operation(
    "POST",
    "/agents/{agent}/checks",
    "Add a test question",
    "checks",
    body=s.CheckBody,
    response=s.CheckOut,
    status=201,
    role="agent",
)
async def create_check(call: Call) -> s.CheckOut:
    body: s.CheckBody = call.body
    agent = await call.agent()
    check = await call.admin.checks.create(
        agent.id,
        body.question,
        expected_facts=body.expected_facts,
        must_cite=body.must_cite,
        language=body.language,
    )
    return s.CheckOut.model_validate(check)


@operation(
    "DELETE",
    r"/agents/{agent}/checks/{id:\d+}",
    "Delete a test question and its results",
    "checks",
    status=204,
    role="agent",
)
async def delete_check(call: Call) -> None:
    agent = await call.agent()
    await call.admin.checks.delete(agent.id, call.id())


@operation(
    "GET",
    "/agents/{agent}/checks/results",
    "Recent results of the test questions",
    "checks",
    query=s.CheckResultQuery,
    response=s.CheckResultList,
    role="agent",
)
async def check_results(call: Call) -> s.CheckResultList:
    query: s.CheckResultQuery = call.query
    agent = await call.agent()
    checks = call.admin.checks
    results = (
        await checks.latest_results(agent.id)
        if query.latest
        else await checks.results(agent.id, limit=query.limit)
    )
    return s.CheckResultList.model_validate({"items": results})


# -- playground -----------------------------------------------------------------------------


class PlaygroundOutput:
    """The widget's SSE events, then ``diagnostics``: the trace the turn was saved with."""

    def __init__(
        self,
        response: web.StreamResponse,
        admin: AdminServices,
        details: dict[str, Any] | None,
    ) -> None:
        self._response = response
        self._sse = SseTurnOutput(response)
        self._admin = admin
        self._details = details

    async def emit(self, event: TurnEvent) -> None:
        await self._sse.emit(event)
        if event.kind != "done" or self._details is None:
            return
        turn_id = event.data.get("turn_id")
        trace = (
            s.TurnTraceOut.model_validate(await self._admin.transcripts.turn(int(turn_id)))
            if turn_id is not None
            else None
        )
        data = {**self._details, "turn": trace.model_dump(mode="json") if trace else None}
        payload = json.dumps(data, ensure_ascii=False)
        await self._response.write(f"event: diagnostics\ndata: {payload}\n\n".encode())


@operation(
    "POST",
    "/agents/{agent}/playground",
    "Chat with an agent as a visitor would, with overrides for this chat only",
    "playground",
    body=s.PlaygroundBody,
    stream=True,
    events=PLAYGROUND_EVENTS,
    role="agent",
)
async def playground(call: Call) -> web.StreamResponse:
    """Server-sent events as the widget gets them (status, token, sources, done or error),
    then a diagnostics event with the turn's trace. The chat is saved on the playground
    channel: it counts no usage and is left out of the conversation list unless asked for."""
    body: s.PlaygroundBody = call.body
    agent = await call.agent()
    session_id = body.session_id or f"pg-{uuid.uuid4().hex}"
    overrides = {
        k: v
        for k, v in {
            "language": body.language,
            "segment": body.segment,
            "site_type": body.site_type,
            "diagnostics": body.diagnostics,
        }.items()
        if v is not None
    }
    turn = TurnRequest(
        agent=agent.slug,
        channel="playground",
        conversation_key=session_id,
        text=body.message,
        page=body.page,
        language=body.language,
        overrides=overrides,
        writing_rule=WRITING_RULE,
    )
    details = {"session_id": session_id, "overrides": overrides, "staff": call.staff.label}
    return await call.request.app[WEB_CHANNEL].stream(
        call.request,
        turn,
        headers={"X-Parley-Session": session_id},
        output=lambda response: PlaygroundOutput(
            response, call.admin, details if body.diagnostics else None
        ),
    )


# Registered last: the inbox work's operations are declared in their own module.
from gateway.admin import inbox_api  # noqa: E402, F401
