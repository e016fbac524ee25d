"""The OpenAPI 3.1 document at /api/v1/openapi.json, generated from the routes' own models."""

from __future__ import annotations

import functools
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Literal

from aiohttp import web
from pydantic import BaseModel
from pydantic.json_schema import JsonSchemaMode, models_json_schema

from channels.api import TurnBody
from channels.base import Channel, WebhookDoc
from channels.knowledge_api import ProcessBody, ProcessOut, SearchBody, SearchOut
from channels.registry import CHANNELS
from channels.web import ChatBody, ClearBody, FeedbackBody
from core.store.database import MAX_ID
from core.store.staff import Role
from gateway.admin.api import OPERATIONS, Operation
from gateway.admin.auth import CSRF_HEADER, SESSION_COOKIE
from gateway.admin.events import CONVERSATION_EVENTS, TURN_EVENTS, ErrorData, Events
from gateway.admin.schemas import ErrorOut

OPENAPI_PATH = "/api/v1/openapi.json"
_REF = "#/components/schemas/{model}"
_PARAM = re.compile(r"\{(\w+)(?::([^}]*))?\}")
# A path id: the route takes digits; beyond these bounds nothing is found (404).
_ID = {"type": "integer", "format": "int64", "minimum": 1, "maximum": MAX_ID}


_Rule = dict[str, Any] | tuple[type[BaseModel], str]


@dataclass(frozen=True)
class _Doc:
    """What the document says about one route; admin operations and channel routes alike."""

    method: str
    route: str
    operation_id: str
    summary: str
    tag: str
    query: type[BaseModel] | None = None
    body: type[BaseModel] | None = None
    body_type: str = "application/json"
    response: type[BaseModel] | None = None
    status: int = 200
    stream: bool = False
    # the events a stream sends, by name, with the model of each one's data
    events: Events = ()
    security: Literal["admin", "public", "api_key", "widget_key", "webhook"] = "admin"
    description: str = ""
    # (name, required, description) of query parameters read without a model
    parameters: tuple[tuple[str, bool, str], ...] = ()
    # parameters (path or query) that take only some strings: the JSON Schema of their
    # values, or the (model, field) whose rule applies to them too
    rules: tuple[tuple[str, _Rule], ...] = ()
    # a rate-limited request is answered in the stream's own form (an error event)
    limited_as_event: bool = False
    # the staff role an admin route needs (None for the routes staff do not sign in to)
    role: Role | None = None


def _from_operation(op: Operation) -> _Doc:
    return _Doc(
        method=op.method,
        route=op.route,
        operation_id=op.name,
        summary=op.summary,
        tag=f"admin: {op.tag}",
        query=op.query,
        body=op.body,
        response=op.response,
        status=op.status,
        stream=op.stream,
        events=op.events,
        security="public" if op.public else "admin",
        description=op.handler.__doc__ or "",
        role=None if op.public else op.role,
    )


_CHANNEL_ROUTES = (
    _Doc(
        "POST",
        "/api/v1/agents/{agent}/chat",
        "widget_chat",
        "A visitor's message from the website widget; the answer streams as SSE",
        "channels",
        body=ChatBody,
        stream=True,
        events=TURN_EVENTS,
        security="widget_key",
        description="Events: status, token, sources, related (when there are pages to read "
        "on), then done or error. Over the rate limit, the 429 is an error event too.",
        limited_as_event=True,
    ),
    _Doc(
        "POST",
        "/api/v1/agents/{agent}/conversations/clear",
        "widget_clear",
        "The widget's new conversation: the session's memory is forgotten",
        "channels",
        body=ClearBody,
        status=204,
        security="widget_key",
    ),
    _Doc(
        "POST",
        "/api/v1/agents/{agent}/feedback",
        "widget_feedback",
        "A visitor's thumbs up or down on one of their answers (a later one replaces it)",
        "channels",
        body=FeedbackBody,
        status=204,
        security="widget_key",
        description="turn_id is the done event's. Only the session's own answers can be "
        "rated: any other turn is a 404, whether it exists or not. A thumbs-down shows among "
        "the agent's content gaps, with the comment.",
    ),
    _Doc(
        "GET",
        "/api/v1/agents/{agent}/conversations/events",
        "widget_events",
        "Staff replies and handoff changes of a widget conversation, live",
        "channels",
        stream=True,
        events=CONVERSATION_EVENTS,
        security="public",
        description="Events: state, staff, handoff. The browser's EventSource sends no "
        "headers, so the widget key is a query parameter.",
        parameters=(
            ("session_id", True, "the widget's session id"),
            ("key", True, "the agent's widget key"),
            ("since", False, "resume after this message id (or send Last-Event-ID)"),
        ),
        rules=(
            ("session_id", (ChatBody, "session_id")),
            ("since", {"type": "string", "pattern": "^[0-9]*$", "maxLength": 19}),
        ),
    ),
    _Doc(
        "DELETE",
        "/api/v1/agents/{agent}/conversations/{conversation_key}",
        "api_clear",
        "Forget a JSON API conversation's memory (its messages stay for staff)",
        "channels",
        status=204,
        security="api_key",
        rules=(("conversation_key", (TurnBody, "session_id")),),
    ),
    _Doc(
        "POST",
        "/api/v1/agents/{agent}/turns",
        "api_turn",
        "One turn answered in full, as JSON",
        "channels",
        body=TurnBody,
        security="api_key",
    ),
    _Doc(
        "POST",
        "/api/v1/pipelines/{agent:[^/:]+}:process",
        "pipeline_process",
        "A question answered from the agent's knowledge (the knowledge-query contract)",
        "channels",
        body=ProcessBody,
        response=ProcessOut,
        security="api_key",
        description="previous_messages stands for the conversation (user and assistant "
        "turns, oldest first) instead of what the session remembers; filters narrow the "
        "pages by tag, on top of the agent's own filters. parameters takes only page; an "
        "unknown field or parameter is refused (400, naming it). 503 when the model fails.",
    ),
    _Doc(
        "POST",
        "/api/v1/pipelines/{agent:[^/:]+}:search",
        "pipeline_search",
        "The agent's best pages for a query, with the passages found on each",
        "channels",
        body=SearchBody,
        response=SearchOut,
        security="api_key",
        description="One result per page, best first, whether or not it clears the agent's "
        "threshold (passed says). filters narrow the pages by tag, on top of the agent's own.",
    ),
)


def _from_webhook(channel: Channel, hook: WebhookDoc) -> _Doc:
    """A messaging channel's route, as the channel declares it (`channels.registry`)."""
    environment = ", ".join(f.setting.upper() for f in channel.credential_fields if f.setting)
    return _Doc(
        hook.method.upper(),
        hook.path,
        hook.operation_id,
        hook.summary,
        "channels",
        body_type=hook.content_type or "application/json",
        security="webhook",
        description=f"{channel.title}: verified with the agent's own credentials "
        f"(channels.{channel.block} of PATCH /api/v1/admin/agents/{{agent}}), else with the "
        f"environment's ({environment}).",
    )


_SECURITY: dict[str, list[dict[str, list[str]]]] = {
    "admin": [{"adminToken": []}, {"staffSession": []}],
    "public": [],
    "api_key": [{"apiKey": []}],
    "widget_key": [{"widgetKey": []}],
    "webhook": [],
}
_ERRORS = {
    "400": "malformed request: the message names the field",
    "401": "not signed in, or a wrong token",
    "403": "refused (e.g. a missing or wrong CSRF token)",
    "404": "no such agent or item",
    "409": "conflicts with what exists, or with the server's configuration (e.g. a channel "
    "secret to store and no PARLEY_SECRETS_KEY to encrypt it with)",
    "429": "too many requests",
    "503": "unavailable (e.g. the admin side is disabled)",
}
_ROLES: dict[Role, str] = {
    "admin": "Role: admin. An agent's session is refused (403, role_required).",
    "agent": "Role: agent or admin (any signed-in staff).",
}
_ADMIN_ONLY = (
    "refused: this operation needs the admin role (role_required), or a missing or wrong CSRF token"
)
_BODY_ERRORS = {
    "408": "the request body did not all arrive in time",
    "413": "the request body is larger than the gateway takes (1 MiB)",
    "415": "the request body is not of the media type the operation takes",
}


def _rule(
    doc: _Doc, name: str, refs: dict[tuple[type[BaseModel], str], Any], schemas: dict[str, Any]
) -> dict[str, Any]:
    """The JSON Schema of a parameter read without a model: a string, unless a rule says."""
    rule = dict(doc.rules).get(name)
    if rule is None:
        return {"type": "string"}
    if isinstance(rule, dict):
        return rule
    model, field = rule
    component = refs[(model, "validation")]["$ref"].rsplit("/", 1)[1]
    prop = schemas[component]["properties"][field]
    # An optional field's rule for its value, without the null it may also be.
    for option in prop.get("anyOf", [prop]):
        if option.get("type") != "null":
            return {k: v for k, v in option.items() if k not in ("title", "description")}
    raise ValueError(f"{model.__name__}.{field} has no rule for a value")


def _path_parameters(
    doc: _Doc, refs: dict[tuple[type[BaseModel], str], Any], schemas: dict[str, Any]
) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": dict(_ID) if pattern == r"\d+" else _rule(doc, name, refs, schemas),
        }
        for name, pattern in _PARAM.findall(doc.route)
    ]


def _events(events: Events, refs: dict[tuple[type[BaseModel], str], Any]) -> dict[str, Any]:
    """What each event of a stream is: its name, and one line of JSON data of that name's
    model (OpenAPI 3.2 calls this the stream's ``itemSchema``; before 3.2, ``schema``)."""
    return {
        "description": "one event of the stream; its data is JSON",
        "oneOf": [
            {
                "title": f"{name} event",
                "type": "object",
                "required": ["event", "data"],
                "properties": {
                    "event": {"const": name},
                    "data": {
                        "type": "string",
                        "contentMediaType": "application/json",
                        "contentSchema": refs[(model, "serialization")],
                    },
                    "id": {"type": "string"},
                },
            }
            for name, model in events
        ],
    }


def _query_parameters(model: type[BaseModel], schemas: dict[str, Any]) -> list[dict[str, Any]]:
    schema = schemas[model.__name__]
    required = set(schema.get("required", []))
    return [
        {
            "name": name,
            "in": "query",
            "required": name in required,
            "description": prop.get("description", ""),
            "schema": {k: v for k, v in prop.items() if k != "description"},
        }
        for name, prop in schema.get("properties", {}).items()
    ]


def _operation(
    doc: _Doc, refs: dict[tuple[type[BaseModel], str], Any], schemas: dict[str, Any]
) -> dict[str, Any]:
    parameters = _path_parameters(doc, refs, schemas)
    if doc.query is not None:
        parameters += _query_parameters(doc.query, schemas)
    parameters += [
        {"name": name, "in": "query", "required": required, "description": text,
         "schema": _rule(doc, name, refs, schemas)}
        for name, required, text in doc.parameters
    ]  # fmt: skip
    responses: dict[str, Any] = {}
    if doc.stream:
        responses[str(doc.status)] = {
            "description": "a stream of server-sent events: "
            + ", ".join(name for name, _ in doc.events),
            "content": {"text/event-stream": {"schema": _events(doc.events, refs)}},
        }
    elif doc.response is not None:
        responses[str(doc.status)] = {
            "description": "OK",
            "content": {"application/json": {"schema": refs[(doc.response, "serialization")]}},
        }
    elif doc.status == 204:
        responses["204"] = {"description": "done; no content"}
    else:
        responses[str(doc.status)] = {
            "description": "OK",
            "content": {"application/json": {"schema": {"type": "object"}}},
        }
    error = {"application/json": {"schema": refs[(ErrorOut, "serialization")]}}
    has_body = doc.body is not None or doc.method in ("POST", "PUT", "PATCH")
    for status, description in (_ERRORS | (_BODY_ERRORS if has_body else {})).items():
        if status == "403" and doc.role == "admin":
            description = _ADMIN_ONLY
        responses[status] = {"description": description, "content": error}
    if doc.limited_as_event:
        events = _events((("error", ErrorData),), refs)
        responses["429"] = {
            "description": "too many messages: an error event (rate_limited), with Retry-After",
            "content": {"text/event-stream": {"schema": events}},
        }
    result: dict[str, Any] = {
        "operationId": doc.operation_id,
        "summary": doc.summary,
        "tags": [doc.tag],
        "parameters": parameters,
        "responses": responses,
        "security": _SECURITY[doc.security],
    }
    description = " ".join(
        part for part in (_ROLES[doc.role] if doc.role else "", doc.description) if part
    )
    if description:
        result["description"] = " ".join(description.split())
    if doc.role is not None:
        result["x-parley-role"] = doc.role
    if doc.body is not None:
        result["requestBody"] = {
            "required": True,
            "content": {doc.body_type: {"schema": refs[(doc.body, "validation")]}},
        }
    elif doc.method in ("POST", "PUT", "PATCH") and doc.tag == "channels":
        result["requestBody"] = {"content": {doc.body_type: {"schema": {"type": "object"}}}}
    return result


def _models(docs: Iterable[_Doc]) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    wanted: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {
        (ErrorOut, "serialization"): None,
        (ErrorData, "serialization"): None,
    }
    for doc in docs:
        for model, mode in (
            (doc.query, "validation"),
            (doc.body, "validation"),
            (doc.response, "serialization"),
            *((event, "serialization") for _, event in doc.events),
            *((rule[0], "validation") for _, rule in doc.rules if isinstance(rule, tuple)),
        ):
            if model is not None:
                wanted[(model, mode)] = None  # type: ignore[index]
    return list(wanted)


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The whole document; every admin operation is in it by construction."""
    docs = [
        *(_from_operation(op) for op in OPERATIONS),
        *_CHANNEL_ROUTES,
        *(_from_webhook(channel, hook) for channel in CHANNELS for hook in channel.webhooks),
    ]
    refs, top = models_json_schema(_models(docs), ref_template=_REF)
    schemas: dict[str, Any] = top.get("$defs", {})
    paths: dict[str, dict[str, Any]] = {}
    for doc in docs:
        path = _PARAM.sub(r"{\1}", doc.route)
        paths.setdefault(path, {})[doc.method.lower()] = _operation(doc, refs, schemas)  # type: ignore[arg-type]
    return {
        "openapi": "3.1.0",
        "info": {
            "title": "Parley",
            "version": "1",
            "description": "The admin API of the staff console (Bearer PARLEY_ADMIN_TOKEN, or "
            f"a staff session cookie plus {CSRF_HEADER} on state-changing requests), and the "
            "public channel routes.",
        },
        "paths": paths,
        "components": {
            "schemas": schemas,
            "securitySchemes": {
                "adminToken": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "PARLEY_ADMIN_TOKEN",
                },
                "staffSession": {
                    "type": "apiKey",
                    "in": "cookie",
                    "name": SESSION_COOKIE,
                    "description": f"from POST /api/v1/admin/sign-in; "
                    f"state-changing requests also need {CSRF_HEADER}",
                },
                "apiKey": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "an agent's API key (`parley key create`)",
                },
                "widgetKey": {"type": "apiKey", "in": "header", "name": "X-Parley-Key"},
            },
        },
    }


async def _serve(request: web.Request) -> web.Response:
    return web.json_response(openapi_document())


def openapi_routes() -> list[web.RouteDef]:
    return [web.get(OPENAPI_PATH, _serve)]
