"""The knowledge-query contract: a question answered (``:process``) or searched (``:search``)
by an agent, for callers that keep the conversation themselves and filter by page tags.

Both take the JSON API's keys (`ApiChannel.authorized_agent`). Their bodies are strict: a field
or a parameter this API does not know is refused with a 400 naming it, rather than ignored,
so a misspelt filter never widens what may answer; nor is a value of another type
coerced.
"""

from __future__ import annotations

from typing import Literal

from aiohttp import web
from pydantic import BaseModel, ConfigDict, Field

from channels.api import SESSION_ID, ApiChannel
from channels.inbound import read_body
from core.answer.pipeline import AnswerPipeline
from core.retrieval.page_search import search_pages
from core.tags import TagFilters
from core.turns import (
    MAX_MESSAGE_CHARS,
    CleanText,
    PageContext,
)

_LANGUAGE = r"^[A-Za-z]{2,3}([-_][A-Za-z0-9]{2,8})?$"
MAX_RESULTS = 20
MAX_PREVIOUS_MESSAGES = 50
# An earlier answer may be longer than a question.
MAX_PREVIOUS_CHARS = 2 * MAX_MESSAGE_CHARS
SEARCH_RESULTS = 10  # pages a search returns when max_results is not given
# The contract's roles as a turn names them.
_ROLES: dict[str, Literal["visitor", "assistant"]] = {"user": "visitor", "assistant": "assistant"}


class _Strict(BaseModel):
    # Nothing is coerced either: 0 is no false, "3" no number.
    model_config = ConfigDict(extra="forbid", strict=True, str_strip_whitespace=True)


class PreviousMessage(_Strict):
    role: Literal["user", "assistant"]
    content: CleanText = Field(min_length=1, max_length=MAX_PREVIOUS_CHARS)


class ProcessParameters(_Strict):
    """How the question is answered, beyond the fields of the body; nothing else is taken."""

    page: PageContext | None = Field(
        default=None, description="the page the question is asked on: url, title and its text"
    )


class ProcessBody(_Strict):
    query: CleanText = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    query_language: str | None = Field(
        None, pattern=_LANGUAGE, description="the question's language, as a hint"
    )
    session_id: str | None = Field(
        None,
        pattern=SESSION_ID.pattern,
        description="the conversation's key (a new one when absent; returned)",
    )
    max_results: int | None = Field(
        None, ge=1, le=MAX_RESULTS, description="sources the answer may use (default 5)"
    )
    previous_messages: list[PreviousMessage] | None = Field(
        None,
        max_length=MAX_PREVIOUS_MESSAGES,
        description="the conversation so far, oldest first; used instead of what the "
        "session remembers",
    )
    parameters: ProcessParameters = ProcessParameters()
    filters: TagFilters = Field(default_factory=TagFilters)


class ResponseOptions(_Strict):
    return_examined_corpus_str: bool = Field(
        default=False,
        description="also return examined_corpus_str: every page examined, as one text",
    )


class SearchBody(_Strict):
    query: CleanText = Field(min_length=1, max_length=MAX_MESSAGE_CHARS)
    max_results: int = Field(SEARCH_RESULTS, ge=1, le=MAX_RESULTS, description="pages to return")
    filters: TagFilters = Field(default_factory=TagFilters)
    response_options: ResponseOptions = ResponseOptions()


class SourceOut(BaseModel):
    id: int = Field(description="the number the answer cites it by, as [1]")
    title: str
    url: str
    score: float


class RelatedOut(BaseModel):
    title: str
    url: str


class ProcessOut(BaseModel):
    answer: str
    sources: list[SourceOut] = Field(description="the sources the answer cites")
    confidence: float | None = Field(description="estimated probability the answer is right")
    low_confidence: bool
    citations: list[int]
    mode: str = Field(description="how it was answered: llm, extractive, curated...")
    session_id: str
    conversation_id: int | None
    turn_id: int | None
    related: list[RelatedOut] = Field(description="pages to read on that the answer did not use")


class SearchResultOut(BaseModel):
    title: str
    url: str
    body: str = Field(description="the passages of the page that were found, in page order")
    score: float = Field(description="the ranking score of its best passage")
    tags: list[str]
    passed: bool = Field(description="its best passage clears the agent's confidence threshold")


class SearchOut(BaseModel):
    results: list[SearchResultOut] = Field(description="one per page, best first")
    low_confidence: bool = Field(description="too few passages clear the threshold to answer")
    examined_corpus_str: str | None = Field(
        None,
        description="with response_options.return_examined_corpus_str: each page examined "
        "(number, title, URL, tags, passages), separated by a line of '='",
    )


class KnowledgeApi:
    def __init__(self, api: ApiChannel, pipeline: AnswerPipeline) -> None:
        self._api = api
        self._pipeline = pipeline

    async def process(self, request: web.Request) -> web.Response:
        """The question answered as a JSON API turn would be, from the caller's conversation."""
        agent = await self._api.authorized_agent(request)
        body = await read_body(request, ProcessBody)
        previous = (
            None
            if body.previous_messages is None
            else tuple((_ROLES[m.role], m.content) for m in body.previous_messages)
        )
        session, outcome, output = await self._api.answer(
            agent,
            body.session_id,
            body.query,
            language=body.query_language,
            page=body.parameters.page,
            previous_messages=previous,
            max_results=body.max_results,
            include_tags=body.filters.include,
            exclude_tags=body.filters.exclude,
        )
        answered = ProcessOut(
            answer=outcome.answer,
            sources=[SourceOut.model_validate(s.public()) for s in outcome.sources],
            confidence=outcome.confidence,
            low_confidence=outcome.low_confidence,
            citations=list(outcome.citations),
            mode=outcome.mode,
            session_id=session,
            conversation_id=outcome.conversation_id,
            turn_id=outcome.turn_id,
            related=[RelatedOut.model_validate(r) for r in output.related],
        )
        return web.json_response(answered.model_dump(mode="json"))

    async def search(self, request: web.Request) -> web.Response:
        """The best pages for the query, with the passages found on each."""
        agent = await self._api.authorized_agent(request)
        body = await read_body(request, SearchBody)
        found = await search_pages(
            self._pipeline.retriever,
            agent,
            body.query,
            limit=body.max_results,
            include_tags=body.filters.include,
            exclude_tags=body.filters.exclude,
        )
        searched = SearchOut(
            results=[
                SearchResultOut(
                    title=page.title,
                    url=page.url,
                    body=page.body,
                    score=page.score,
                    tags=list(page.tags),
                    passed=page.passed,
                )
                for page in found.results
            ],
            low_confidence=found.retrieval.low_confidence,
            examined_corpus_str=(
                found.examined_corpus()
                if body.response_options.return_examined_corpus_str
                else None
            ),
        )
        exclude = (
            None if body.response_options.return_examined_corpus_str else {"examined_corpus_str"}
        )
        return web.json_response(searched.model_dump(mode="json", exclude=exclude))
