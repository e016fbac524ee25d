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
from channels.web import ChatBody, ClearBody
from gateway.admin.api import OPERATIONS, Operation
from gateway.admin.auth import CSRF_HEADER, SESSION_COOKIE
from gateway.admin.schemas import ErrorOut

OPENAPI_PATH = "/api/v1/openapi.json"
_REF = "#/components/schemas/{model}"
_PARAM = re.compile(r"\{(\w+)(?::([^}]*))?\}")


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
    security: Literal["admin", "public", "api_key", "widget_key", "webhook"] = "admin"
    description: str = ""
    # (name, required, description) of query parameters read without a model
    parameters: tuple[tuple[str, bool, str], ...] = ()


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
        security="public" if op.public else "admin",
        description=op.handler.__doc__ or "",
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
        security="widget_key",
        description="Events: status, token, sources, then done or error.",
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
        "GET",
        "/api/v1/agents/{agent}/conversations/events",
        "widget_events",
        "Staff replies and handoff changes of a widget conversation, live",
        "channels",
        stream=True,
        security="public",
        description="Events: state, staff, handoff. The browser's EventSource sends no "
        "headers, so the widget key is a query parameter.",
        parameters=(
            ("session_id", True, "the widget's session id"),
            ("key", True, "the agent's widget key"),
            ("since", False, "resume after this message id (or send Last-Event-ID)"),
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
        "/webhooks/twilio/{agent}",
        "twilio_webhook",
        "Twilio WhatsApp webhook (form-encoded, signed with X-Twilio-Signature)",
        "channels",
        body_type="application/x-www-form-urlencoded",
        security="webhook",
    ),
    _Doc(
        "POST",
        "/webhooks/twilio/status",
        "twilio_status",
        "Twilio delivery-status callback",
        "channels",
        body_type="application/x-www-form-urlencoded",
        security="webhook",
    ),
    _Doc(
        "POST",
        "/webhooks/telegram/{agent}",
        "telegram_webhook",
        "Telegram Bot API update (X-Telegram-Bot-Api-Secret-Token)",
        "channels",
        security="webhook",
    ),
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
    "429": "too many requests",
    "503": "unavailable (e.g. the admin side is disabled)",
}


def _path_parameters(route: str) -> list[dict[str, Any]]:
    return [
        {
            "name": name,
            "in": "path",
            "required": True,
            "schema": {"type": "integer"} if pattern == r"\d+" else {"type": "string"},
        }
        for name, pattern in _PARAM.findall(route)
    ]


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
    parameters = _path_parameters(doc.route)
    if doc.query is not None:
        parameters += _query_parameters(doc.query, schemas)
    parameters += [
        {"name": name, "in": "query", "required": required, "description": text,
         "schema": {"type": "string"}}
        for name, required, text in doc.parameters
    ]  # fmt: skip
    responses: dict[str, Any] = {}
    if doc.stream:
        responses[str(doc.status)] = {
            "description": "a stream of server-sent events",
            "content": {"text/event-stream": {"schema": {"type": "string"}}},
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
    for status, description in _ERRORS.items():
        responses[status] = {"description": description, "content": error}
    result: dict[str, Any] = {
        "operationId": doc.operation_id,
        "summary": doc.summary,
        "tags": [doc.tag],
        "parameters": parameters,
        "responses": responses,
        "security": _SECURITY[doc.security],
    }
    if doc.description:
        result["description"] = " ".join(doc.description.split())
    if doc.body is not None:
        result["requestBody"] = {
            "required": True,
            "content": {doc.body_type: {"schema": refs[(doc.body, "validation")]}},
        }
    elif doc.method in ("POST", "PUT", "PATCH") and doc.tag == "channels":
        result["requestBody"] = {"content": {doc.body_type: {"schema": {"type": "object"}}}}
    return result


def _models(docs: Iterable[_Doc]) -> list[tuple[type[BaseModel], JsonSchemaMode]]:
    wanted: dict[tuple[type[BaseModel], JsonSchemaMode], None] = {(ErrorOut, "serialization"): None}
    for doc in docs:
        for model, mode in (
            (doc.query, "validation"),
            (doc.body, "validation"),
            (doc.response, "serialization"),
        ):
            if model is not None:
                wanted[(model, mode)] = None  # type: ignore[index]
    return list(wanted)


@functools.cache
def openapi_document() -> dict[str, Any]:
    """The whole document; every admin operation is in it by construction."""
    docs = [*(_from_operation(op) for op in OPERATIONS), *_CHANNEL_ROUTES]
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
