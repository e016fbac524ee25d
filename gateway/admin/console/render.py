"""The staff console's page frame: templates, the navigation, notices, forms and their errors."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime
from functools import wraps
from typing import Any, TypeVar
from urllib.parse import urlencode
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

import aiohttp_jinja2
import jinja2
from aiohttp import web
from multidict import MultiDictProxy
from pydantic import BaseModel, ValidationError

from channels.registry import CHANNELS
from core.errors import InvalidInput, ParleyError
from core.store.agents import Agent
from core.store.staff import Role
from gateway.admin.api import Call
from gateway.admin.auth import csrf_token, current_staff
from gateway.admin.services import AdminServices
from gateway.keys import ADMIN, CONSOLE_TEMPLATES
from gateway.middlewares import status_for

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Model = TypeVar("Model", bound=BaseModel)
Form = MultiDictProxy[Any]

# What staff call each channel: a messaging channel by its title in the registry, then the
# channels answered within the request.
CHANNEL_NAMES = {
    **{channel.name: channel.title for channel in CHANNELS},
    "web": "Website",
    "api": "API",
    "playground": "Playground",
    "test": "Answer check",
}
STATUS_NAMES = {"bot": "Bot", "waiting_for_staff": "Waiting for staff", "staff": "Staff"}

# What a redirect after a successful form may announce (?done=...). A fixed list, so that
# a crafted link cannot make the console show words of someone else's choosing.
NOTICES = {
    "taken-over": "You have taken this conversation over; the bot is paused.",
    "handed-back": "The conversation is back with the bot.",
    "replied": "Your reply is on its way.",
    "template-sent": "The template is on its way.",
    "templates-saved": "Templates saved.",
    "exploration-saved": "Exploration settings saved.",
    "gaps-resolved": "Marked as resolved.",
    "source-added": "Source added; it is being indexed.",
    "source-reindexing": "The source is being read again.",
    "source-removed": "Source removed, with its pages.",
    "source-tags-saved": "Source tags saved; its pages carry them now.",
    "page-tags-saved": "Page tags saved.",
    "curated-created": "Curated answer added.",
    "curated-saved": "Curated answer saved.",
    "curated-deleted": "Curated answer deleted.",
    "check-created": "Test question added.",
    "check-deleted": "Test question deleted.",
    "settings-saved": "Settings saved.",
    "channels-saved": "Channel credentials saved.",
    "widget-key-rotated": "New widget key made; update the script tag on your site.",
    "inbox-retried": "Taken up again; the answers follow as soon as they are made.",
    "status-open": "Marked open.",
    "status-pending": "Marked pending.",
    "status-resolved": "Resolved; the conversation is back with the bot.",
    "assigned": "Assignment changed.",
    "labelled": "Labels changed.",
    "noted": "Note added; only staff see it.",
    "saved-reply-added": "Reply saved.",
    "saved-reply-deleted": "Saved reply deleted.",
}

# Each page sends these: the console shows conversations and settings, so no other site may
# frame it, no browser may cache it, and only its own script and style may run.
SECURITY_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'self'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'; "
        "object-src 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}


def zone(name: str | None) -> ZoneInfo:
    try:
        return ZoneInfo(name or "UTC")
    except (ZoneInfoNotFoundError, ValueError):
        return ZoneInfo("UTC")


def _local(value: datetime | None, timezone: str | None, fmt: str = "%Y-%m-%d %H:%M") -> str:
    if value is None:
        return ""
    return value.astimezone(zone(timezone)).strftime(fmt)


def _percent(value: float | None) -> str:
    return "–" if value is None else f"{round(value * 100)}%"


# A turn's steps in the order they run; steps not named here follow, the total comes last.
_STEPS = ("curated", "rewrite", "retrieve", "rerank", "generate")


def _in_order(timings: Mapping[str, float]) -> list[tuple[str, float]]:
    def rank(name: str) -> tuple[int, int, str]:
        known = _STEPS.index(name) if name in _STEPS else len(_STEPS)
        return (name == "total", known, name)

    return sorted(timings.items(), key=lambda item: rank(item[0]))


def setup_templates(app: web.Application) -> None:
    env = aiohttp_jinja2.setup(
        app,
        app_key=CONSOLE_TEMPLATES,
        loader=jinja2.PackageLoader("gateway", "templates"),
        autoescape=True,
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        default_helpers=False,
    )
    env.filters.update(local=_local, percent=_percent, in_order=_in_order)
    env.globals.update(CHANNEL_NAMES=CHANNEL_NAMES, STATUS_NAMES=STATUS_NAMES, url_with=url_with)


def url_with(path: str, query: Mapping[str, Any]) -> str:
    """``path`` with the query parameters that have a value."""
    given = {k: v for k, v in query.items() if v not in (None, "", False)}
    return f"{path}?{urlencode(given)}" if given else path


def admin(request: web.Request) -> AdminServices:
    return request.app[ADMIN]


async def agent_of(request: web.Request) -> Agent:
    """The agent a page under /admin/agents/{agent} is about."""
    return await admin(request).agents.get(request.match_info["agent"])


def agent_page(agent: Agent, section: str) -> str:
    return f"/admin/agents/{agent.slug}/{section}"


def call(request: web.Request, body: Any = None, query: Any = None) -> Call:
    """An admin API operation as the console makes it: same services, same signed-in staff."""
    return Call(request, request.app[ADMIN], body=body, query=query)


async def run(
    operation: Callable[[Call], Awaitable[object]],
    request: web.Request,
    returns: type[Model],
    *,
    body: Any = None,
    query: Any = None,
) -> Model:
    """The answer of an admin API operation: the very model the JSON API would send."""
    answer = await operation(call(request, body, query))
    if not isinstance(answer, returns):
        raise TypeError(f"{getattr(operation, '__name__', operation)} gave {type(answer)}")
    return answer


@dataclass(frozen=True, slots=True)
class Route:
    """A console route and the staff role it needs: admin unless it says agent, or None for
    the sign-in routes, which come before anyone is signed in. `gateway.admin.console`
    checks the role before the handler runs, as the admin API does for its operations."""

    method: str
    path: str
    handler: Handler
    role: Role | None = "admin"


def route(method: str, path: str, handler: Handler, *, role: Role | None = "admin") -> Route:
    return Route(method, path, handler, role)


async def refused(request: web.Request, needed: Role) -> web.Response:
    """The page for a signed-in staff member whose role may not see a page or send a form."""
    return await render(
        request,
        "admin/error.html",
        title="Not available to your role",
        status=403,
        message=f"This page is for staff with the {needed} role; you are signed in as "
        f"{current_staff(request).role}. Ask an admin if you need it.",
    )


@dataclass(frozen=True, slots=True)
class Section:
    slug: str
    title: str
    role: Role = "admin"


# The agent last looked at: pages that are about no agent in particular link to its pages.
AGENT_COOKIE = "parley_console_agent"

AGENT_SECTIONS = (
    Section("gaps", "Content gaps", "agent"),
    Section("sources", "Sources"),
    Section("curated", "Curated answers", "agent"),
    Section("checks", "Answer checks", "agent"),
    Section("playground", "Playground", "agent"),
    Section("settings", "Settings"),
    Section("privacy", "Privacy"),
)


def home_section(request: web.Request) -> str:
    """The page an agent's link opens: its settings for an admin, its gaps for an agent."""
    return "settings" if current_staff(request).may("admin") else "gaps"


async def render(
    request: web.Request,
    template: str,
    *,
    title: str,
    agent: Agent | None = None,
    section: str = "",
    status: int = 200,
    error: str | None = None,
    **context: Any,
) -> web.Response:
    """A console page inside the frame: navigation, the signed-in staff member, notices."""
    agents = await admin(request).agents.list()
    remembered = request.cookies.get(AGENT_COOKIE)
    current = agent or next((a for a in agents if a.slug == remembered), None)
    current = current or (agents[0] if agents else None)
    notice = NOTICES.get(request.query.get("done", ""))
    staff = current_staff(request)
    text = aiohttp_jinja2.render_string(
        template,
        request,
        {
            "title": title,
            "staff": staff,
            "is_admin": staff.may("admin"),
            "csrf_token": csrf_token(request),
            "agents": agents,
            "agent": agent,
            "nav_agent": current,
            # Only what this staff member may open is offered.
            "sections": [s for s in AGENT_SECTIONS if staff.may(s.role)],
            "home_section": home_section(request),
            "section": section,
            "notice": notice,
            "error": error,
            **context,
        },
        app_key=CONSOLE_TEMPLATES,
    )
    response = web.Response(
        text=text, status=status, content_type="text/html", headers=SECURITY_HEADERS
    )
    if agent is not None and agent.slug != remembered:
        response.set_cookie(
            AGENT_COOKIE, agent.slug, path="/admin", httponly=True, samesite="Strict"
        )
    return response


def render_bare(
    request: web.Request, template: str, *, status: int = 200, **context: Any
) -> web.Response:
    """A page without the signed-in frame (sign-in, errors before sign-in)."""
    text = aiohttp_jinja2.render_string(template, request, context, app_key=CONSOLE_TEMPLATES)
    return web.Response(
        text=text, status=status, content_type="text/html", headers=SECURITY_HEADERS
    )


def redirect(path: str, done: str | None = None, anchor: str = "") -> web.HTTPSeeOther:
    """Back to a page after a form did its work (POST, then redirect, then GET)."""
    location = url_with(path, {"done": done}) + (f"#{anchor}" if anchor else "")
    return web.HTTPSeeOther(location)


def page(handler: Handler) -> Handler:
    """A GET page: what goes wrong is shown as a page of the console, not as JSON."""

    @wraps(handler)
    async def show(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except ParleyError as exc:
            return await render(
                request,
                "admin/error.html",
                title="Something is wrong",
                status=status_for(exc),
                message=exc.message,
            )

    return show


# -- forms ----------------------------------------------------------------------------------


async def form(request: web.Request) -> Form:
    return await request.post()


def text(data: Form, name: str) -> str:
    value = data.get(name, "")
    return value.strip() if isinstance(value, str) else ""


def optional(data: Form, name: str) -> str | None:
    return text(data, name) or None


def lines(data: Form, name: str) -> list[str]:
    return [line.strip() for line in text(data, name).splitlines() if line.strip()]


def items(data: Form, name: str) -> list[str]:
    """A comma- or line-separated list."""
    return [item.strip() for item in re.split(r"[,\n]", text(data, name)) if item.strip()]


def checked(data: Form, name: str) -> bool:
    return text(data, name) in ("on", "true", "1", "yes")


def problems(exc: ValidationError, labels: Mapping[str, str] | None = None) -> str:
    """Pydantic's complaints as one sentence a person can act on."""
    said = []
    for problem in exc.errors():
        field = ".".join(str(p) for p in problem["loc"])
        label = (labels or {}).get(field, field.replace("_", " "))
        message = re.sub(r"^Value error, ", "", problem["msg"])
        said.append(f"{label}: {message}" if label else message)
    return "; ".join(said)


def validated(
    model: type[Model], values: Mapping[str, Any], labels: Mapping[str, str] | None = None
) -> Model:
    """A form's values checked by the same model the JSON API checks them with."""
    try:
        return model.model_validate(dict(values))
    except ValidationError as exc:
        raise InvalidInput(problems(exc, labels)) from None


def ids(values: Iterable[str]) -> list[int]:
    try:
        return [int(v) for v in values if v.strip()]
    except ValueError:
        raise InvalidInput("not a list of numbers") from None
