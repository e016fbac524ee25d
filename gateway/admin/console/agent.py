"""The console pages about one agent's behaviour: settings, answer checks and the playground."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from zoneinfo import available_timezones

from aiohttp import web

from channels.registry import CHANNELS
from core.answer.escalation import DEFAULT_HANDOFF_TEXTS, DEFAULT_OUT_OF_HOURS_TEXTS, WEEKDAYS
from core.errors import InvalidInput, ParleyError
from gateway.admin.api import (
    agent_out,
    check_results,
    create_check,
    delete_check,
    list_checks,
    patch_agent,
    rotate_widget_key,
)
from gateway.admin.console.answer_limits import limit_patch, limit_values
from gateway.admin.console.exploration import LABELS as EXPLORATION_LABELS
from gateway.admin.console.exploration import exploration_patch
from gateway.admin.console.privacy import retention_line
from gateway.admin.console.render import (
    Form,
    Route,
    admin,
    agent_of,
    agent_page,
    call,
    checked,
    form,
    home_section,
    lines,
    optional,
    page,
    redirect,
    render,
    route,
    run,
    text,
    validated,
)
from gateway.admin.console.tags import tag_patch, tag_values
from gateway.admin.schemas import (
    MAX_TEMPLATES,
    AgentOut,
    AgentPatch,
    CheckBody,
    CheckList,
    CheckResultList,
    CheckResultQuery,
)
from gateway.keys import SETTINGS
from gateway.middlewares import status_for

AGENT = "/admin/agents/{agent}"
DAY_NAMES = dict(zip(WEEKDAYS, ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday",
                                "Saturday", "Sunday"), strict=True))  # fmt: skip
TEXTS = {"handoff_text": DEFAULT_HANDOFF_TEXTS, "out_of_hours_text": DEFAULT_OUT_OF_HOURS_TEXTS}
_SETTINGS_LABELS = {
    "name": "Name",
    "persona": "Persona",
    "custom_prompt": "Extra instructions",
    "default_language": "Language",
    "timezone": "Time zone",
    "confidence_threshold": "Minimum knowledge match",
    "contact_route": "Contact route",
    "allowed_origins": "Allowed origins",
}


# -- the list of agents ---------------------------------------------------------------------


@page
async def agents_page(request: web.Request) -> web.StreamResponse:
    agents = await admin(request).agents.list()
    return await render(
        request,
        "admin/agents.html",
        title="Agents",
        section="agents",
        rows=[agent_out(a) for a in agents],
    )


@page
async def agent_home(request: web.Request) -> web.StreamResponse:
    agent = await agent_of(request)
    raise web.HTTPSeeOther(agent_page(agent, home_section(request)))


# -- settings -------------------------------------------------------------------------------


def _languages(agent: AgentOut) -> list[str]:
    configured: set[str] = set()
    for name in TEXTS:
        value = getattr(agent, name)
        if isinstance(value, Mapping):
            configured |= set(value)
    return sorted(set(DEFAULT_HANDOFF_TEXTS) | {agent.default_language} | configured)


def _hours_shown(hours: Mapping[str, Any] | None) -> dict[str, str]:
    if not hours:
        return {day: "" for day in WEEKDAYS}
    shown = {}
    for day in WEEKDAYS:
        spans = hours.get(day)
        if isinstance(spans, str):
            shown[day] = spans
        elif spans:
            shown[day] = ", ".join(str(s) for s in spans)
        else:
            shown[day] = "closed"
    return shown


def _settings_values(agent: AgentOut) -> dict[str, Any]:
    values: dict[str, Any] = {
        "name": agent.name,
        "persona": agent.persona,
        "custom_prompt": agent.custom_prompt,
        "default_language": agent.default_language,
        "timezone": agent.timezone,
        "threshold": f"{agent.confidence_threshold * 100:g}",
        "contact_route": agent.contact_route,
        "allowed_origins": "\n".join(agent.allowed_origins),
        "handoff_enabled": agent.handoff_enabled,
        "feedback_prompt": agent.feedback_prompt,
        **tag_values(agent),
        **limit_values(agent),
    }
    for day, shown in _hours_shown(agent.business_hours).items():
        values[f"hours_{day}"] = shown
    for name in TEXTS:
        configured = getattr(agent, name)
        values[name] = configured if isinstance(configured, str) else ""
        for language in _languages(agent):
            by_language = configured if isinstance(configured, Mapping) else {}
            values[f"{name}_{language}"] = by_language.get(language, "")
    return values


def _threshold(data: Form) -> float:
    given = text(data, "threshold").replace(",", ".").rstrip("%").strip()
    try:
        percent = float(given)
    except ValueError:
        raise InvalidInput(
            f"Minimum knowledge match: {given!r} is not a percentage such as 35"
        ) from None
    if not 0 <= percent <= 100:
        raise InvalidInput("Minimum knowledge match: give a percentage from 0 to 100")
    return percent / 100


def _hours(data: Form) -> dict[str, list[str] | str] | None:
    given = {day: text(data, f"hours_{day}") for day in WEEKDAYS}
    if not any(given.values()):
        return None  # no hours at all: staff are taken to be there at any time
    hours: dict[str, list[str] | str] = {}
    for day, value in given.items():
        if not value or value.lower() == "closed":
            hours[day] = "closed"
        else:
            hours[day] = [span.strip() for span in value.split(",") if span.strip()]
    return hours


def _texts(data: Form, name: str, languages: list[str]) -> str | dict[str, str] | None:
    every = text(data, name)
    if every:
        return every
    by_language = {lang: text(data, f"{name}_{lang}") for lang in languages}
    return {lang: value for lang, value in by_language.items() if value} or None


@dataclass(frozen=True, slots=True)
class CredentialInput:
    """One declared credential field as the channel form shows it."""

    name: str  # in the settings block
    input: str  # the form's field: <block>_<name>
    label: str
    help: str
    secret: bool
    required: bool
    value: str = ""  # the stored value of a field that is not secret; a secret is never shown
    is_set: bool = False  # whether a secret is stored


@dataclass(frozen=True, slots=True)
class ChannelForm:
    """A messaging channel's part of the credentials form, from its declaration."""

    block: str
    title: str
    configured: bool
    fields: tuple[CredentialInput, ...]


def channel_forms(agent: AgentOut) -> list[ChannelForm]:
    forms = []
    for channel in CHANNELS:
        shown = getattr(agent.channels, channel.block)
        fields = []
        for spec in channel.credential_fields:
            fields.append(
                CredentialInput(
                    name=spec.name,
                    input=f"{channel.block}_{spec.name}",
                    label=spec.label,
                    help=spec.help[:1].upper() + spec.help[1:],
                    secret=spec.secret,
                    required=spec.required,
                    value="" if spec.secret else getattr(shown, spec.name) or "",
                    is_set=spec.secret and getattr(shown, f"{spec.name}_set"),
                )
            )
        forms.append(ChannelForm(channel.block, channel.title, shown.configured, tuple(fields)))
    return forms


@dataclass(frozen=True, slots=True)
class TemplateRow:
    """One approved template in the templates form (blank: a new one to add)."""

    input: str  # the form's fields: <input>_name, <input>_provider_id, ...
    number: int
    name: str = ""
    provider_id: str = ""
    language: str = ""
    text: str = ""
    stored: bool = False  # saved before: offered for removal


@dataclass(frozen=True, slots=True)
class TemplateForm:
    """A channel with a customer window: its part of the templates form, from its
    declaration (`channels.base.Channel.template_id`)."""

    block: str
    title: str
    hours: float
    id_label: str
    id_help: str
    rows: tuple[TemplateRow, ...]


_TEMPLATE_FIELDS = ("name", "provider_id", "language", "text")


def _window_channels() -> list[Any]:
    return [c for c in CHANNELS if c.customer_window_hours is not None]


def template_forms(source: AgentOut | Form) -> list[TemplateForm]:
    """Each window channel's templates: those the agent has, then a blank row to add one;
    or those a sent form gave (to show them again with what was wrong)."""
    forms = []
    for channel in _window_channels():
        block = channel.block
        rows: list[TemplateRow] = []
        if isinstance(source, AgentOut):
            stored = getattr(source.channels, block).templates
            for number, t in enumerate(stored, start=1):
                rows.append(
                    TemplateRow(f"{block}_t{number}", number, t.name, t.provider_id,
                                t.language, t.text, stored=True)
                )  # fmt: skip
            rows.append(TemplateRow(f"{block}_t{len(rows) + 1}", len(rows) + 1))
        else:
            for number in range(1, _row_count(source, block) + 1):
                key = f"{block}_t{number}"
                given = {f: _template_text(source, f"{key}_{f}") for f in _TEMPLATE_FIELDS}
                stored_row = text(source, f"{key}_stored") == "1"
                rows.append(TemplateRow(key, number, **given, stored=stored_row))
        spec = channel.template_id
        forms.append(
            TemplateForm(
                block=block,
                title=channel.title,
                hours=float(channel.customer_window_hours),
                id_label=spec.label if spec else "Template id",
                id_help=spec.help if spec else "",
                rows=tuple(rows),
            )
        )
    return forms


def _row_count(data: Form, block: str) -> int:
    try:
        return max(0, min(int(text(data, f"{block}_rows")), MAX_TEMPLATES + 1))
    except ValueError:
        return 0


def _template_text(data: Form, name: str) -> str:
    # A textarea sends CRLF line breaks; the approved text has plain ones.
    return text(data, name).replace("\r\n", "\n")


def _templates_patch(data: Form) -> tuple[dict[str, Any], dict[str, str]]:
    """Each window channel's templates as the form gives them (rows left blank or ticked for
    removal left out), and the names its errors give each field."""
    channels: dict[str, Any] = {}
    labels: dict[str, str] = {}
    for form_of in template_forms(data):
        kept: list[dict[str, str]] = []
        for row in form_of.rows:
            values = {f: getattr(row, f) for f in _TEMPLATE_FIELDS}
            if checked(data, f"{row.input}_remove") or not any(values.values()):
                continue
            where = f"channels.{form_of.block}.templates.{len(kept)}"
            for field, label in zip(
                _TEMPLATE_FIELDS, ("name", form_of.id_label, "language", "text"), strict=True
            ):
                labels[f"{where}.{field}"] = f"{form_of.title} template {row.number}, {label}"
            kept.append(values)
        labels[f"channels.{form_of.block}.templates"] = f"{form_of.title} templates"
        channels[form_of.block] = {"templates": kept}
    return channels, labels


async def _settings_page(
    request: web.Request,
    *,
    error: str | None = None,
    status: int = 200,
    values: dict[str, Any] | None = None,
    templates_sent: Form | None = None,
) -> web.Response:
    stored = await agent_of(request)
    agent = agent_out(stored)
    public_url = request.app[SETTINGS].public_url
    origin = str(public_url).rstrip("/") if public_url else str(request.url.origin())
    return await render(
        request,
        "admin/settings.html",
        title=f"Settings · {agent.name}",
        agent=stored,
        section="settings",
        error=error,
        status=status,
        a=agent,
        values=values or _settings_values(agent),
        languages=_languages(agent),
        days=DAY_NAMES,
        default_texts=TEXTS,
        timezones=sorted(available_timezones()),
        channel_forms=channel_forms(agent),
        channel_titles=[(c.name, c.title) for c in CHANNELS],
        retention=retention_line(request.app[SETTINGS]),
        template_forms=template_forms(templates_sent if templates_sent is not None else agent),
        widget_snippet=(
            f'<script src="{origin}/widget.js" data-agent="{agent.slug}" '
            f'data-key="{agent.widget_key}" async></script>'
        ),
    )


@page
async def settings_page(request: web.Request) -> web.StreamResponse:
    return await _settings_page(request)


@page
async def save_settings_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    agent = agent_out(await agent_of(request))
    languages = _languages(agent)
    values: dict[str, Any] = {k: v for k, v in data.items() if isinstance(v, str)}
    values["handoff_enabled"] = checked(data, "handoff_enabled")
    values["feedback_prompt"] = checked(data, "feedback_prompt")
    values["answer_cache"] = checked(data, "answer_cache")
    tags, tag_labels = tag_patch(data)
    try:
        body = validated(
            AgentPatch,
            {
                "name": text(data, "name"),
                "persona": text(data, "persona"),
                "custom_prompt": text(data, "custom_prompt"),
                "default_language": text(data, "default_language"),
                "timezone": text(data, "timezone"),
                "confidence_threshold": _threshold(data),
                "contact_route": text(data, "contact_route"),
                "allowed_origins": lines(data, "allowed_origins"),
                "business_hours": _hours(data),
                "handoff_enabled": checked(data, "handoff_enabled"),
                "handoff_text": _texts(data, "handoff_text", languages),
                "out_of_hours_text": _texts(data, "out_of_hours_text", languages),
                "feedback_prompt": checked(data, "feedback_prompt"),
                **tags,
                "settings": limit_patch(data),
            },
            _SETTINGS_LABELS | tag_labels | {"settings": "Answer cache and quotas"},
        )
        await patch_agent(call(request, body=body))
    except ParleyError as exc:
        return await _settings_page(
            request, error=exc.message, status=status_for(exc), values=values
        )
    raise redirect(agent_page(await agent_of(request), "settings"), "settings-saved")


def _channel_patch(data: Form, agent: AgentOut) -> dict[str, Any]:
    """Each channel's block as the form gives it. Secrets left empty stay as they are (a form
    never shows them, so it cannot resend them); another field left empty is removed."""
    channels: dict[str, Any] = {}
    for form_of in channel_forms(agent):
        if checked(data, f"{form_of.block}_remove"):
            channels[form_of.block] = None
            continue
        block: dict[str, Any] = {}
        for field in form_of.fields:
            if not field.secret:
                block[field.name] = optional(data, field.input)
            elif text(data, field.input):
                block[field.name] = text(data, field.input)
        if form_of.configured or any(value is not None for value in block.values()):
            channels[form_of.block] = block
    return channels


# The names the form's errors give a field: "Bot token (Telegram)".
_CHANNEL_LABELS = {
    f"channels.{channel.block}.{spec.name}": f"{spec.label} ({channel.title})"
    for channel in CHANNELS
    for spec in channel.credential_fields
}


@page
async def save_channels_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    agent = agent_out(await agent_of(request))
    try:
        body = validated(AgentPatch, {"channels": _channel_patch(data, agent)}, _CHANNEL_LABELS)
        await patch_agent(call(request, body=body))
    except ParleyError as exc:
        return await _settings_page(request, error=exc.message, status=status_for(exc))
    raise redirect(agent_page(await agent_of(request), "settings"), "channels-saved", "channels")


@page
async def save_templates_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    channels, labels = _templates_patch(data)
    try:
        body = validated(AgentPatch, {"channels": channels}, labels)
        await patch_agent(call(request, body=body))
    except ParleyError as exc:
        return await _settings_page(
            request, error=exc.message, status=status_for(exc), templates_sent=data
        )
    raise redirect(agent_page(await agent_of(request), "settings"), "templates-saved", "templates")


@page
async def save_exploration_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    try:
        body = validated(AgentPatch, {"settings": exploration_patch(data)}, EXPLORATION_LABELS)
        await patch_agent(call(request, body=body))
    except ParleyError as exc:
        return await _settings_page(request, error=exc.message, status=status_for(exc))
    raise redirect(
        agent_page(await agent_of(request), "settings"), "exploration-saved", "exploration"
    )


@page
async def rotate_key_action(request: web.Request) -> web.StreamResponse:
    await rotate_widget_key(call(request))
    raise redirect(agent_page(await agent_of(request), "settings"), "widget-key-rotated", "widget")


# -- answer checks --------------------------------------------------------------------------


async def _checks_page(
    request: web.Request,
    *,
    error: str | None = None,
    status: int = 200,
    values: Mapping[str, Any] | None = None,
) -> web.Response:
    agent = await agent_of(request)
    checks = await run(list_checks, request, CheckList)
    latest = await run(
        check_results, request, CheckResultList, query=CheckResultQuery(latest=True, limit=1000)
    )
    return await render(
        request,
        "admin/checks.html",
        title=f"Answer checks · {agent.name}",
        agent=agent,
        section="checks",
        error=error,
        status=status,
        checks=checks.items,
        results={r.check_id: r for r in latest.items},
        passed=sum(r.passed for r in latest.items),
        timezone=agent.timezone,
        values=values or {},
    )


@page
async def checks_page(request: web.Request) -> web.StreamResponse:
    return await _checks_page(request)


@page
async def create_check_action(request: web.Request) -> web.StreamResponse:
    data = await form(request)
    values = {
        "question": text(data, "question"),
        "expected_facts": lines(data, "expected_facts"),
        "must_cite": optional(data, "must_cite"),
        "language": optional(data, "language"),
    }
    try:
        body = validated(
            CheckBody,
            values,
            {"question": "Question", "must_cite": "URL to cite", "language": "Language", "": ""},
        )
        await create_check(call(request, body=body))
    except ParleyError as exc:
        shown = {**values, "expected_facts": "\n".join(values["expected_facts"] or [])}
        return await _checks_page(request, error=exc.message, status=status_for(exc), values=shown)
    raise redirect(agent_page(await agent_of(request), "checks"), "check-created")


@page
async def delete_check_action(request: web.Request) -> web.StreamResponse:
    try:
        await delete_check(call(request))
    except ParleyError as exc:
        return await _checks_page(request, error=exc.message, status=status_for(exc))
    raise redirect(agent_page(await agent_of(request), "checks"), "check-deleted")


# -- playground -----------------------------------------------------------------------------


@page
async def playground_page(request: web.Request) -> web.StreamResponse:
    agent = await agent_of(request)
    return await render(
        request,
        "admin/playground.html",
        title=f"Playground · {agent.name}",
        agent=agent,
        section="playground",
        endpoint=f"/api/v1/admin/agents/{agent.slug}/playground",
        languages=sorted(set(DEFAULT_HANDOFF_TEXTS) | {agent.default_language}),
    )


def routes() -> list[Route]:
    check = AGENT + r"/checks/{id:\d+}"
    return [
        route("GET", "/admin/agents", agents_page, role="agent"),
        route("GET", AGENT, agent_home, role="agent"),
        route("GET", AGENT + "/settings", settings_page),
        route("POST", AGENT + "/settings", save_settings_action),
        route("POST", AGENT + "/settings/channels", save_channels_action),
        route("POST", AGENT + "/settings/templates", save_templates_action),
        route("POST", AGENT + "/settings/widget-key", rotate_key_action),
        route("POST", AGENT + "/settings/exploration", save_exploration_action),
        route("GET", AGENT + "/checks", checks_page, role="agent"),
        route("POST", AGENT + "/checks", create_check_action, role="agent"),
        route("POST", check + "/delete", delete_check_action, role="agent"),
        route("GET", AGENT + "/playground", playground_page, role="agent"),
    ]
