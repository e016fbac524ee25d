"""Reading what the public endpoints are sent, one strict way for every channel.

A webhook or a widget request is bytes from anyone. Whatever is wrong with them (a charset
other than UTF-8, bytes that are not UTF-8, a form field that is not UTF-8 once
percent-decoded, JSON that does not parse, is nested too deep, or holds a number no column
can keep, fields of the wrong type) becomes `InvalidInput`, which the gateway answers with a
400 and the JSON error body, before anything is stored. Nothing here may raise anything else.

- `read_form`: an ``application/x-www-form-urlencoded`` body (Twilio's webhooks);
- `read_json` / `parse_json`: any JSON value, within `MAX_JSON_DEPTH` and with finite numbers;
- `read_body` / `parse_body`: a JSON body checked against a pydantic model;
- `validated`: a parsed value checked against a pydantic model (a Telegram Update);
- `find_agent`: the agent a path or query string names.

The body's size is bounded by the application (``client_max_size``: 413 above it).
"""

from __future__ import annotations

import math
from typing import Any, TypeVar
from urllib.parse import parse_qsl

from aiohttp import web
from multidict import MultiDict, MultiDictProxy
from pydantic import BaseModel, ValidationError
from pydantic_core import from_json

from core.errors import AgentNotFound, InvalidInput
from core.store.agents import Agent, Agents, validate_slug

M = TypeVar("M", bound=BaseModel)

FORM = "application/x-www-form-urlencoded"
# Containers inside containers: a Telegram Update nests about eight deep, a chat body two.
MAX_JSON_DEPTH = 32
# Twilio sends a few dozen fields (ten media at most).
MAX_FORM_FIELDS = 1000
# Charsets a body may declare: JSON is UTF-8 (RFC 8259), and so are Twilio's forms.
_UTF8 = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})


def check_charset(request: web.Request) -> None:
    """`InvalidInput` unless the body's declared charset (if any) is UTF-8 or ASCII."""
    charset = request.charset
    if charset is not None and charset.strip().lower() not in _UTF8:
        raise InvalidInput(f"charset {charset[:40]!r} is not supported: send UTF-8")


def decode_utf8(raw: bytes) -> str:
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise InvalidInput(f"the body is not valid UTF-8 (at byte {exc.start})") from None


async def read_form(request: web.Request) -> MultiDictProxy[str]:
    """An ``application/x-www-form-urlencoded`` body, every name and value UTF-8, in order
    (a repeated field keeps each value)."""
    if request.content_type != FORM:
        raise InvalidInput(f"the body must be {FORM}")
    check_charset(request)
    text = decode_utf8(await request.read())
    try:
        pairs = parse_qsl(
            text.rstrip(),
            keep_blank_values=True,
            encoding="utf-8",
            errors="strict",
            max_num_fields=MAX_FORM_FIELDS,
        )
    except UnicodeDecodeError:
        raise InvalidInput("a form field is not valid UTF-8 once percent-decoded") from None
    except ValueError:
        raise InvalidInput(f"more than {MAX_FORM_FIELDS} form fields") from None
    return MultiDictProxy(MultiDict(pairs))


def parse_json(raw: bytes) -> Any:
    """``raw`` as a JSON value: UTF-8, no deeper than `MAX_JSON_DEPTH`, numbers finite.

    A lone surrogate escape (``"\\ud800"``) is refused too: PostgreSQL cannot store it.
    """
    text = decode_utf8(raw)
    try:
        value = from_json(text, allow_inf_nan=False)
    except ValueError as exc:
        raise InvalidInput(f"the body is not valid JSON: {exc}") from None
    _check_json(value)
    return value


def _check_json(value: Any) -> None:
    # Walked without recursion: the depth is what is being checked.
    pending: list[tuple[Any, int]] = [(value, 1)]
    while pending:
        item, depth = pending.pop()
        if isinstance(item, float) and not math.isfinite(item):
            raise InvalidInput("the body holds a number out of range")
        if isinstance(item, dict | list):
            if depth > MAX_JSON_DEPTH:
                raise InvalidInput(f"the body is nested more than {MAX_JSON_DEPTH} levels deep")
            children = item.values() if isinstance(item, dict) else item
            pending.extend((child, depth + 1) for child in children)


async def read_json(request: web.Request) -> Any:
    """The request's body as a JSON value (see `parse_json`), its charset checked first."""
    check_charset(request)
    return parse_json(await request.read())


def validated(model: type[M], data: Any, what: str = "") -> M:
    """``data`` as ``model``; the first problem, with where it is, as `InvalidInput`."""
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        problem = exc.errors()[0]
        where = ".".join(str(p) for p in problem["loc"]) or "body"
        message = problem["msg"].removeprefix("Value error, ")  # a validator's own words
        raise InvalidInput(f"{what}{where}: {message}") from None


def parse_body(raw: bytes, model: type[M]) -> M:
    """A JSON request body as ``model``; malformed JSON or fields give a clear 400."""
    return validated(model, parse_json(raw))


async def read_body(request: web.Request, model: type[M]) -> M:
    """The request's JSON body as ``model``, its charset checked first."""
    check_charset(request)
    return parse_body(await request.read(), model)


async def find_agent(agents: Agents, slug: str) -> Agent:
    """The agent named ``slug`` (from a path or a query string); `AgentNotFound` at once for a
    name no agent can have, which is never looked up (a NUL in it would fail the query)."""
    try:
        validate_slug(slug)
    except InvalidInput:
        raise AgentNotFound(slug[:100]) from None
    return await agents.get(slug)
