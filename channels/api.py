"""The JSON API: one turn per request, answered in full, for a shop's own integrations."""

from __future__ import annotations

import re
import uuid
from typing import Any

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from channels.inbound import find_agent, read_body
from core.answer.pipeline import AnswerPipeline, TurnOutcome
from core.errors import Forbidden, InvalidInput, NotFound, Unauthorized, Unavailable
from core.store.agents import Agent, Agents
from core.store.api_keys import ApiKeys
from core.tags import NO_FILTERS, TagFilters
from core.turns import MAX_MESSAGE_CHARS, CleanText, CollectingTurnOutput, PageContext, TurnRequest

# A conversation key the caller chooses (session_id).
SESSION_ID = re.compile(r"^[A-Za-z0-9_:.+-]{1,200}$")


class TurnBody(BaseModel):
    model_config = ConfigDict(extra="ignore", str_strip_whitespace=True)

    message: CleanText = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    session_id: str | None = Field(None, pattern=SESSION_ID.pattern)
    page: PageContext | None = None
    language: str | None = Field(None, pattern=r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})?$")
    filters: TagFilters | None = Field(
        None, description="which pages may answer, by tag, besides the agent's own filters"
    )


class ApiChannel:
    def __init__(self, pipeline: AnswerPipeline, agents: Agents, keys: ApiKeys) -> None:
        self._pipeline = pipeline
        self._agents = agents
        self._keys = keys

    async def authorized_agent(self, request: web.Request) -> Agent:
        """The agent named in the path, when the request carries one of its API keys."""
        scheme, _, key = request.headers.get("Authorization", "").partition(" ")
        key = key.strip()
        if scheme.lower() != "bearer" or not key:
            raise Unauthorized("send the API key as 'Authorization: Bearer <key>'")
        if not (key.isascii() and key.isprintable()):
            raise Unauthorized("invalid API key")  # keys are printable ASCII; no lookup needed
        agent_id = await self._keys.agent_for(key)
        agent = await find_agent(self._agents, request.match_info["agent"])
        if agent.id != agent_id:
            raise Forbidden("this API key belongs to another agent")
        return agent

    async def clear(self, request: web.Request) -> web.Response:
        """Forget a conversation's memory (its messages stay for staff); 404 when unknown."""
        agent = await self.authorized_agent(request)
        key = request.match_info["conversation_key"]
        if not SESSION_ID.fullmatch(key):
            raise InvalidInput("conversation_key: use the session_id the turns were sent with")
        if not await self._pipeline.memory.clear(agent.id, "api", key):
            raise NotFound(f"no conversation {key!r} for this agent")
        return web.Response(status=204)

    async def answer(
        self, agent: Agent, session: str | None, text: str, **fields: Any
    ) -> tuple[str, TurnOutcome, CollectingTurnOutput]:
        """One JSON API turn answered in full, in conversation ``session`` (a new one when
        None), with more `TurnRequest` ``fields``: the session, the outcome and every event.
        `Unavailable` when the answer could not be generated."""
        session = session or uuid.uuid4().hex
        output = CollectingTurnOutput()
        outcome = await self._pipeline.run(
            TurnRequest(agent=agent.slug, channel="api", conversation_key=session, text=text,
                        **fields),
            output,
        )  # fmt: skip
        if outcome.error is not None:
            raise Unavailable(f"the answer could not be generated ({outcome.error})")
        return session, outcome, output

    async def turn(self, request: web.Request) -> web.Response:
        agent = await self.authorized_agent(request)
        body = await read_body(request, TurnBody)
        filters = body.filters or NO_FILTERS
        session, outcome, output = await self.answer(
            agent,
            body.session_id,
            body.message,
            page=body.page,
            language=body.language,
            include_tags=filters.include,
            exclude_tags=filters.exclude,
        )
        return web.json_response(
            {
                "answer": outcome.answer,
                "sources": [s.public() for s in outcome.sources],
                "citations": list(outcome.citations),
                "confidence": outcome.confidence,
                "low_confidence": outcome.low_confidence,
                "mode": outcome.mode,
                "session_id": session,
                "conversation_id": outcome.conversation_id,
                "turn_id": outcome.turn_id,
                "related": list(output.related),
            }
        )
