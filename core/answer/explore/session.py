"""One exploration: the model browses the pages with read-only tools, within bounds, and
answers only from what it read; otherwise the turn defers. A model that cannot explore (no
tools on its server, a request that fails) leaves the turn to the answer written as without
exploring."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from core.answer.explore.evidence import Evidence
from core.answer.explore.tools import TOOLS, Toolbox
from core.answer.explore.tree import PageTree
from core.answer.guard import StreamGuard, refusal
from core.answer.phrases import deferral
from core.answer.postprocess import postprocess
from core.answer.prompt import secret_text
from core.answer.sources import SourceRef, cited_first
from core.errors import ModelFailed, ToolsUnsupported
from core.ports import ChatMessage, ChatModel, ChatReply, Usage
from core.retrieval.retriever import RetrievalQuery, Retriever
from core.store.page_catalog import PageCatalog
from core.turns import TurnEvent

log = logging.getLogger(__name__)

DEFAULT_STEPS = 8  # tool calls
DEFAULT_SECONDS = 20.0
MAX_STEPS = 20
MAX_SECONDS = 60.0
# Enough for any citation a model writes ([1] ... [999]): those it may not cite are found.
_ANY_CITATION = 999

RULES = (
    "Besides the sources above, you can explore all of the website's pages, laid out as "
    "read-only files: the page at /en/shipping is the file /en/shipping.md. Call the tools "
    "ls (list a folder), find (names containing a word), grep (lines containing a word or "
    "pattern, in all pages or under a path) and cat (open a page). Each page you open starts "
    "with its number, like [4]. Answer only from the sources above and the pages you opened "
    "with cat; cite each one you use with the number it was given, in square brackets. If "
    "nothing you read answers the question, say so plainly; never guess. You may call at "
    "most {steps} tools; then write the answer for the visitor as plain text."
)


def explores(settings: Mapping[str, Any]) -> bool:
    """Whether the agent answers by exploring its pages (setting ``exploration``)."""
    return settings.get("exploration") is True


def check_settings(settings: Mapping[str, Any]) -> None:
    """ValueError saying what is wrong with the agent's exploration settings, if anything."""
    switch = settings.get("exploration")
    if switch is not None and not isinstance(switch, bool):
        raise ValueError("exploration: give true or false")
    steps = settings.get("exploration_steps")
    if steps is not None and not (type(steps) is int and 1 <= steps <= MAX_STEPS):
        raise ValueError(f"exploration_steps: give a whole number of tool calls, 1 to {MAX_STEPS}")
    seconds = settings.get("exploration_seconds")
    if seconds is not None and not (type(seconds) in (int, float) and 1 <= seconds <= MAX_SECONDS):
        raise ValueError(f"exploration_seconds: give a number of seconds, 1 to {MAX_SECONDS:g}")


@dataclass(frozen=True, slots=True)
class Bounds:
    steps: int
    seconds: float

    @classmethod
    def of(cls, settings: Mapping[str, Any]) -> Bounds:
        """The agent's bounds, within the limits (the defaults for what is no number)."""
        steps = settings.get("exploration_steps")
        seconds = settings.get("exploration_seconds")
        return cls(
            max(1, min(MAX_STEPS, steps)) if type(steps) is int else DEFAULT_STEPS,
            max(1.0, min(MAX_SECONDS, float(seconds)))
            if isinstance(seconds, int | float) and not isinstance(seconds, bool)
            else DEFAULT_SECONDS,
        )


@dataclass
class Explored:
    """What came of it: the answer (already streamed) and the pages it may cite, numbered as
    it cites them; or a deferral, or a refusal when the answer recited the prompt."""

    text: str
    sources: list[SourceRef]
    usage: Usage | None = None
    deferred: bool = False
    leaked: bool = False
    calls: list[dict[str, Any]] = field(default_factory=list)


Emit = Callable[[TurnEvent], Awaitable[None]]
Say = Callable[[str], Awaitable[None]]
# The model asked once more: the messages so far, whether tools are still allowed, seconds left.
Ask = Callable[[Sequence[ChatMessage], bool, float], Awaitable[ChatReply]]


class Explorer:
    def __init__(
        self,
        catalog: PageCatalog,
        retriever: Retriever,
        chat: ChatModel,
        *,
        max_tokens: int,
        temperature: float,
    ) -> None:
        self._catalog = catalog
        self._retriever = retriever
        self._chat = chat
        self._max_tokens = max_tokens
        self._temperature = temperature

    async def explore(
        self,
        query: RetrievalQuery,
        messages: Sequence[ChatMessage],
        sources: Sequence[SourceRef],
        language: str,
        *,
        emit: Emit,
        say: Say,
        trace: dict[str, Any],
    ) -> Explored | None:
        """Explore with the prompt ``messages`` (whose sources are ``sources``), the pages
        pruned by ``query``'s visibility and tag filters before the model sees any; ``say``
        streams the final text. None when the model could not explore: its server takes no
        tools, a request with tools failed (a 5xx, a timeout, a malformed reply) or the answer
        held no words; nothing was said then, and the trace's ``exploration_fell_back`` says
        why."""
        agent = query.agent
        bounds = Bounds.of(agent.settings)
        await emit(TurnEvent.status("searching"))
        tree = PageTree(
            await self._catalog.pages(
                agent.id,
                visibility=query.visibility,
                include_tags=query.include_tags,
                exclude_tags=query.exclude_tags,
            )
        )
        evidence = Evidence(sources)
        tools = Toolbox(
            tree, self._catalog, self._retriever, evidence, agent_id=agent.id, language=language
        )
        rules = RULES.format(steps=bounds.steps)
        chat = [ChatMessage("system", f"{messages[0].content}\n\n{rules}"), *messages[1:]]
        # A second draft (the answer gates asked for one) adds its calls to the first's.
        calls: list[dict[str, Any]] = trace.setdefault("exploration", [])
        trace["exploration_pages"] = len(tree)
        session = _Session(self._ask, chat, tools, bounds, calls, emit)
        try:
            answer, end = await session.run()
        except ToolsUnsupported:
            _fell_back(trace, agent.slug, "tools unsupported by the server")
            return None
        except ModelFailed as exc:
            _fell_back(trace, agent.slug, f"a request with tools failed ({exc.message})")
            return None
        trace["exploration_end"] = end
        usage = session.usage
        if answer is None:
            return await self._defer(agent.contact_route, language, say, usage, calls)
        verdict = StreamGuard(f"{secret_text()} {RULES}").check(answer)
        if verdict in ("hold", "wordless"):
            _fell_back(trace, agent.slug, "the model's answer held no words")
            return None
        if verdict == "leak":
            log.warning("explore.guard.leak agent=%s", agent.slug)
            trace["exploration_end"] = "recited the prompt"
            text = refusal(language)
            await emit(TurnEvent.status("answering"))
            await say(text)
            return Explored(text, [], usage, leaked=True, calls=calls)
        cited = postprocess(answer, _ANY_CITATION, []).source_numbers
        if not cited or any(number not in evidence for number in cited):
            trace["exploration_end"] = "cited nothing it read" if cited else "cited nothing"
            return await self._defer(agent.contact_route, language, say, usage, calls)
        # Numbered as cited, so that what streams is what is stored; the pages it read but
        # does not cite follow.
        text, numbered = cited_first(answer, evidence.pages())
        await emit(TurnEvent.status("answering"))
        await say(text)
        return Explored(text, numbered, usage, calls=calls)

    async def _ask(self, messages: Sequence[ChatMessage], last: bool, timeout: float) -> ChatReply:  # noqa: ASYNC109 - the model call's own deadline
        return await self._chat.respond(
            messages,
            tools=TOOLS,
            tool_choice="none" if last else "auto",
            max_tokens=self._max_tokens,
            temperature=self._temperature,
            timeout=timeout,
        )

    async def _defer(
        self,
        contact_route: str,
        language: str,
        say: Say,
        usage: Usage | None,
        calls: list[dict[str, Any]],
    ) -> Explored:
        text = deferral(language, contact_route)
        await say(text)
        return Explored(text, [], usage, deferred=True, calls=calls)


def _fell_back(trace: dict[str, Any], agent: str, why: str) -> None:
    trace["exploration_fell_back"] = why
    log.warning("explore.fell_back agent=%s why=%s", agent, why)


class _Session:
    """The loop: ask the model, run the tools it calls, until it answers or a bound ends it."""

    def __init__(
        self,
        ask: Ask,
        messages: list[ChatMessage],
        tools: Toolbox,
        bounds: Bounds,
        calls: list[dict[str, Any]],
        emit: Emit,
    ) -> None:
        self._ask = ask
        self._emit = emit
        self._messages = messages
        self._tools = tools
        self._bounds = bounds
        self._calls = calls
        self.usage: Usage | None = None

    async def run(self) -> tuple[str | None, str]:
        """The model's answer (None when a bound ended the exploration) and how it ended."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self._bounds.seconds
        while True:
            remaining = deadline - loop.time()
            if remaining <= 0:
                return None, "time limit"
            last = len(self._calls) >= self._bounds.steps
            # A request that fails (a timeout within the time left included) raises: the turn
            # is then answered as without exploring.
            reply = await self._ask(self._messages, last, remaining)
            self._count(reply.usage)
            if not reply.tool_calls:
                return reply.text, "answered"
            if last:
                return None, "step limit"
            self._messages.append(ChatMessage("assistant", reply.text, reply.tool_calls))
            for call in reply.tool_calls:
                if len(self._calls) >= self._bounds.steps:
                    text = f"Not run: the limit of {self._bounds.steps} tools is reached. Answer."
                else:
                    text = await self._run(call.name, call.arguments)
                self._messages.append(ChatMessage("tool", text, tool_call_id=call.id))

    async def _run(self, name: str, arguments: str) -> str:
        title = self._tools.page_title(name, arguments)
        if title is not None:
            await self._emit(TurnEvent.status("reading", page=title))
        else:
            await self._emit(TurnEvent.status("searching"))
        started = time.perf_counter()
        result = await self._tools.run(name, arguments)
        self._calls.append(
            {
                "tool": name,
                "argument": result.argument,
                "chars": len(result.text),
                "ms": round((time.perf_counter() - started) * 1000, 2),
                "failed": result.failed,
            }
        )
        log.debug("explore.call tool=%s chars=%d", name, len(result.text))
        return result.text

    def _count(self, usage: Usage | None) -> None:
        if usage is None:
            return
        before = self.usage or Usage(0, 0)
        self.usage = Usage(
            before.prompt_tokens + usage.prompt_tokens,
            before.completion_tokens + usage.completion_tokens,
        )
