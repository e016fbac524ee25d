"""The website widget's channel: key and origin checks, rate limits, answers streamed as SSE."""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
from collections.abc import Callable, Mapping
from urllib.parse import urlsplit

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from channels.inbound import find_agent, read_body
from channels.inbound import parse_body as parse_body  # the staff playground's too
from core.answer.pipeline import AnswerPipeline
from core.errors import Forbidden, NotFound, RateLimited, Unauthorized
from core.ports import Cache
from core.store.agents import Agent, Agents
from core.store.feedback import MAX_COMMENT_CHARS, Feedback, Rating
from core.tags import NO_FILTERS, TagFilters
from core.turns import MAX_MESSAGE_CHARS, CleanText, PageContext, TurnEvent, TurnOutput, TurnRequest

log = logging.getLogger(__name__)

WRITING_RULE = (
    "Write for a small chat window: short paragraphs, Markdown for **bold**, lists and links "
    "where they help, no tables, no headings."
)
# Token buckets: (tokens per second, burst); an agent may set its own in
# settings["rate_limits"] = {"session": [rate, burst], "ip": [rate, burst]}.
DEFAULT_LIMITS = {"session": (0.2, 5.0), "ip": (1.0, 30.0)}
# Headers an error response must carry too: the gateway's error middleware adds what a
# handler left here, so a browser on an allowed origin can read why a request failed.
ERROR_HEADERS = web.RequestKey("error_headers", dict[str, str])
_SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache, no-transform",
    "X-Accel-Buffering": "no",  # nginx: do not hold the stream back
}


class ChatBody(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    message: CleanText = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    session_id: str = Field(pattern=r"^[A-Za-z0-9_-]{8,100}$")
    page: PageContext | None = None
    language: str | None = Field(None, pattern=r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})?$")
    filters: TagFilters | None = Field(
        None, description="which pages may answer, by tag, besides the agent's own filters"
    )


class ClearBody(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    session_id: str = Field(pattern=r"^[A-Za-z0-9_-]{8,100}$")


class FeedbackBody(BaseModel):
    """A visitor's thumbs up or down on one of their own answers (``turn_id`` from ``done``)."""

    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    session_id: str = Field(pattern=r"^[A-Za-z0-9_-]{8,100}$")
    turn_id: int = Field(gt=0, lt=2**63)
    rating: Rating
    comment: CleanText | None = Field(None, max_length=MAX_COMMENT_CHARS)


def sse(event: TurnEvent) -> bytes:
    return f"event: {event.kind}\ndata: {json.dumps(event.data, ensure_ascii=False)}\n\n".encode()


class SseTurnOutput:
    """Writes each event as it happens; a closed connection surfaces as ConnectionResetError."""

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response

    async def emit(self, event: TurnEvent) -> None:
        await self._response.write(sse(event))


class _AfterFirst:
    """A turn's output once its first event went out with the response's headers: the
    pipeline's own first event, the same, is not sent twice."""

    def __init__(self, output: TurnOutput, first: TurnEvent) -> None:
        self._output = output
        self._first: TurnEvent | None = first

    async def emit(self, event: TurnEvent) -> None:
        first, self._first = self._first, None
        if event != first:
            await self._output.emit(event)


def _origin(url: str | None) -> str | None:
    if not url:
        return None
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}".lower() if parts.scheme and parts.netloc else None


class WebChannel:
    def __init__(
        self,
        pipeline: AnswerPipeline,
        agents: Agents,
        cache: Cache,
        public_url: str | None,
        *,
        client_address: Callable[[web.Request], str],
        feedback: Feedback | None = None,
    ) -> None:
        self._pipeline = pipeline
        self._feedback = feedback
        self._agents = agents
        self._cache = cache
        self._public_origin = _origin(public_url)
        # The visitor's address, which the per-address limits are kept for: the gateway
        # knows which proxies in front of it may say what it is.
        self.client_address = client_address
        self._turns: set[asyncio.Task[object]] = set()

    async def drain(self, within: float) -> None:
        """Let turns in flight finish (and save) before shutdown."""
        if self._turns:
            await asyncio.wait(set(self._turns), timeout=within)

    def _allowed(self, agent: Agent, origin: str, request: web.Request) -> bool:
        """The agent's allowed origins, plus the gateway's own (so its demo page works)."""
        origin = origin.lower().rstrip("/")
        own = {_origin(str(request.url)), self._public_origin}
        configured = {o.lower().rstrip("/") for o in agent.allowed_origins}
        return origin in own or origin in configured

    def _cors(self, origin: str | None) -> dict[str, str]:
        if not origin:
            return {}
        return {"Access-Control-Allow-Origin": origin, "Vary": "Origin"}

    async def preflight(self, request: web.Request) -> web.Response:
        agent = await find_agent(self._agents, request.match_info["agent"])
        origin = request.headers.get("Origin", "")
        if not origin or not self._allowed(agent, origin, request):
            raise Forbidden("this website is not allowed to use this agent's widget")
        headers = self._cors(origin) | {
            "Access-Control-Allow-Methods": "POST, OPTIONS",
            "Access-Control-Allow-Headers": "Content-Type, X-Parley-Key",
            "Access-Control-Max-Age": "600",
        }
        return web.Response(status=204, headers=headers)

    def admit(self, agent: Agent, request: web.Request, key: str, where: str) -> dict[str, str]:
        """The widget's checks: the page's origin (when the browser sends one) is allowed and
        ``key`` (read from ``where``) is the agent's; returns the CORS headers to answer with."""
        origin = request.headers.get("Origin")
        if origin is not None and not self._allowed(agent, origin, request):
            raise Forbidden("this website is not allowed to use this agent's widget")
        request[ERROR_HEADERS] = self._cors(origin)
        # A header's bytes that are not UTF-8 arrive as surrogates: they match no key.
        if not hmac.compare_digest(key.encode(errors="replace"), agent.widget_key.encode()):
            raise Unauthorized(f"missing or wrong widget key ({where})")
        return self._cors(origin)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        agent = await find_agent(self._agents, request.match_info["agent"])
        origin = request.headers.get("Origin")
        self.admit(agent, request, request.headers.get("X-Parley-Key", ""), "X-Parley-Key")
        body = await read_body(request, ChatBody)
        address = self.client_address(request)
        limited = await self._rate_limited(agent, body.session_id, address)
        if limited is not None:
            return self._too_many(limited, origin)

        turn = TurnRequest(
            agent=agent.slug,
            channel="web",
            conversation_key=body.session_id,
            client_address=address,
            text=body.message,
            page=body.page,
            language=body.language,
            include_tags=(body.filters or NO_FILTERS).include,
            exclude_tags=(body.filters or NO_FILTERS).exclude,
            writing_rule=WRITING_RULE,
        )
        return await self.stream(request, turn, headers=self._cors(origin))

    async def stream(
        self,
        request: web.Request,
        turn: TurnRequest,
        *,
        headers: Mapping[str, str] | None = None,
        output: Callable[[web.StreamResponse], TurnOutput] = SseTurnOutput,
    ) -> web.StreamResponse:
        """Answer ``turn`` as an SSE stream (the widget, and the staff playground, which
        passes an ``output`` of its own to add events)."""
        response = web.StreamResponse(headers=_SSE_HEADERS | dict(headers or {}))
        await response.prepare(request)
        sent = output(response)
        first = TurnEvent.status("searching")
        # The turn runs in a task of its own: should the server cancel this handler when the
        # visitor goes away, the turn still stops its LLM stream and saves what was said.
        task = asyncio.create_task(self._pipeline.run(turn, _AfterFirst(sent, first)))
        self._turns.add(task)
        task.add_done_callback(self._turns.discard)
        # The visitor sees at once that the question arrived: the turn's first event goes
        # out now, with the headers, not once its task gets a moment on a busy event loop.
        with contextlib.suppress(ConnectionResetError):  # gone already: the turn finds out
            await sent.emit(first)
        await asyncio.shield(task)
        # The visitor may have left before the end; the turn is saved regardless.
        with contextlib.suppress(ConnectionResetError):
            await response.write_eof()
        return response

    async def clear(self, request: web.Request) -> web.Response:
        """The widget's "new conversation": the old session's memory is forgotten (its
        messages stay for staff). 204 whether or not the session had a conversation."""
        agent = await find_agent(self._agents, request.match_info["agent"])
        cors = self.admit(agent, request, request.headers.get("X-Parley-Key", ""), "X-Parley-Key")
        body = await read_body(request, ClearBody)
        limited = await self._rate_limited(agent, body.session_id, self.client_address(request))
        if limited is not None:
            raise RateLimited("too many requests; please wait a moment", limited)
        await self._pipeline.memory.clear(agent.id, "web", body.session_id)
        return web.Response(status=204, headers=cors)

    async def feedback(self, request: web.Request) -> web.Response:
        """A thumbs up or down on one of the visitor's own answers: 204 when recorded, 404 for
        a turn that is not this session's (whether it exists or not)."""
        agent = await find_agent(self._agents, request.match_info["agent"])
        cors = self.admit(agent, request, request.headers.get("X-Parley-Key", ""), "X-Parley-Key")
        body = await read_body(request, FeedbackBody)
        limited = await self._rate_limited(
            agent, body.session_id, self.client_address(request), bucket="web-feedback"
        )
        if limited is not None:
            raise RateLimited("too many requests; please wait a moment", limited)
        if self._feedback is None or not await self._feedback.record(
            agent.id, "web", body.session_id, body.turn_id, body.rating, body.comment
        ):
            raise NotFound("no such answer in this conversation")
        log.info("web.feedback agent=%s rating=%s", agent.slug, body.rating)
        return web.Response(status=204, headers=cors)

    async def _rate_limited(
        self, agent: Agent, session: str, ip: str, *, bucket: str = "web"
    ) -> float | None:
        """Seconds to wait when the session or the address is over its budget, else None.
        ``bucket`` keeps budgets apart: rating answers does not use up the chat's."""
        configured = agent.settings.get("rate_limits") or {}
        for scope, key in (
            ("session", f"rate:{bucket}:{agent.id}:session:{session}"),
            ("ip", f"rate:{bucket}:{agent.id}:ip:{ip}"),
        ):
            rate, burst = configured.get(scope) or DEFAULT_LIMITS[scope]
            taken = await self._cache.take_token(key, rate=float(rate), capacity=float(burst))
            if not taken.allowed:
                log.info("web.rate_limited agent=%s scope=%s", agent.slug, scope)
                return taken.retry_after
        return None

    def _too_many(self, retry_after: float, origin: str | None) -> web.Response:
        event = TurnEvent.error("rate_limited", "Too many messages; please wait a moment.")
        headers = (
            _SSE_HEADERS | self._cors(origin) | {"Retry-After": str(max(1, round(retry_after)))}
        )
        return web.Response(status=429, body=sse(event), headers=headers)
