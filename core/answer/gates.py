"""The answer gates: a written answer is validated (and, with a critic, reviewed) before it is
accepted; a rejected one is written once more, then given up for a fallback; its sources are
shown only when it passed."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, field, replace
from typing import Any, Generic, Protocol, TypeVar

from core.answer.contacts import phone_region
from core.answer.critic import Critic, CriticSource, Verdict
from core.answer.sources import SourceRef
from core.answer.validate import Knowledge, unknown_links, url_key, validate
from core.ports import ChatMessage, ChatModel, Usage
from core.store.agents import Agent

# The agent setting naming the gates that hold an answer until it is checked.
SETTING = "answer_gates"
GATES = ("validate", "critic")
# Every gate retries once; this many drafts at most, whatever failed.
MAX_DRAFTS = 3


class Draft(Protocol):
    @property
    def text(self) -> str: ...
    @property
    def error(self) -> str | None: ...
    @property
    def leaked(self) -> bool: ...
    @property
    def usage(self) -> Usage | None: ...


class Page(Protocol):
    @property
    def url(self) -> str: ...


class PageFinder(Protocol):
    async def page_at(self, agent: Agent, url: str) -> Page | None: ...


S = TypeVar("S", bound=SourceRef)
D = TypeVar("D", bound=Draft)


@dataclass(frozen=True, slots=True)
class GatePlan:
    """``holds``: the answer is written in full and checked before the visitor sees any of
    it (validation is enforced); ``critic``: the critic reviews it too."""

    holds: bool
    critic: Critic | None = None


@dataclass
class Gated(Generic[D, S]):
    """What the gates made of a turn: the accepted draft (None: fall back), the sources it
    was written from, and every draft written (each cost tokens)."""

    draft: D | None
    sources: list[S]
    drafts: list[D] = field(default_factory=list)
    passed: bool = False

    def usage(self) -> Usage | None:
        used = [d.usage for d in self.drafts if d.usage is not None]
        if not used:
            return None
        return Usage(sum(u.prompt_tokens for u in used), sum(u.completion_tokens for u in used))


def gate_names(
    settings: Mapping[str, Any], critic_configured: bool, *, streamed: bool = True
) -> tuple[str, ...]:
    """The gates an agent holds its answers for: its ``answer_gates`` setting, else the
    critic (with validation) when a critic model is configured, else validation where the
    answer is not ``streamed`` to the reader (sent whole, holding it costs no first word)."""
    chosen = settings.get(SETTING)
    if isinstance(chosen, list | tuple):
        return tuple(g for g in GATES if g in chosen)
    if critic_configured:
        return GATES
    return () if streamed else ("validate",)


def rejection(draft: str, reasons: Sequence[str], question: str) -> list[ChatMessage]:
    """The messages that ask the model to write a rejected answer again."""
    because = "; ".join(reasons)
    return [
        ChatMessage("assistant", draft),
        ChatMessage(
            "user",
            f"Your previous answer was rejected because {because}. Write it again, following "
            "every rule above: cite only the numbered sources given, link only to their "
            "addresses, use plain Markdown without HTML, and answer the visitor's question: "
            f"{question}",
        ),
    ]


def _entry(
    gate: str, attempt: int, verdict: str, reasons: Sequence[str] = (), **more: Any
) -> dict[str, Any]:
    return {"gate": gate, "attempt": attempt, "verdict": verdict, "reasons": list(reasons), **more}


class AnswerGates:
    """The gates of one pipeline: ``chat`` is the model the critic is asked through."""

    def __init__(
        self,
        pages: PageFinder,
        chat: ChatModel | None = None,
        *,
        critic_model: str | None = None,
        critic_timeout: float = 8.0,
    ) -> None:
        self._pages = pages
        self._critic = (
            Critic(chat, critic_model, timeout=critic_timeout)
            if chat is not None and critic_model
            else None
        )

    def plan(self, agent: Agent, *, streamed: bool = True) -> GatePlan:
        """What holds this agent's answers (``streamed``: token by token to the reader): the
        critic implies validation (the answer is held for it anyway); asked for without a
        critic model, the critic is left out."""
        names = gate_names(agent.settings, self._critic is not None, streamed=streamed)
        critic = self._critic if "critic" in names else None
        return GatePlan(
            holds=bool(names) and (critic is not None or "validate" in names), critic=critic
        )

    async def check(
        self, text: str, sources: Sequence[SourceRef], agent: Agent, *, said: str = ""
    ) -> list[str]:
        """`validate` the text, after looking its unknown links up among the agent's pages;
        ``said``: the visitor's question, whose own numbers and addresses it may repeat."""
        knowledge = Knowledge(
            source_urls=[s.url for s in sources],
            source_texts=[s.text for s in sources],
            contact_route=agent.contact_route,
            site_url=agent.site_url,
            said=said,
            region=phone_region(agent.timezone, agent.default_language),
        )
        found: set[str] = set()
        for url in unknown_links(text, knowledge):
            page = await self._pages.page_at(agent, url)
            if page is not None:
                found.add(page.url)
        return validate(text, replace(knowledge, pages=frozenset(found)))

    async def record(
        self,
        text: str,
        sources: Sequence[SourceRef],
        agent: Agent,
        trace: list[dict[str, Any]],
        *,
        said: str = "",
    ) -> bool:
        """Validate an answer already sent (nothing held it): the verdict is only recorded
        (an answer that failed shows no sources and is not kept in the answer cache)."""
        reasons = await self.check(text, sources, agent, said=said)
        trace.append(
            _entry("validate", 1, "failed" if reasons else "passed", reasons, enforced=False)
        )
        return not reasons

    async def fallback(
        self,
        text: str,
        sources: Sequence[SourceRef],
        agent: Agent,
        trace: list[dict[str, Any]],
        *,
        quoted: bool,
        said: str = "",
    ) -> bool:
        """Record the fallback given instead of rejected drafts (the sources' quote, or a
        deferral); whether it passes validation itself, so its sources may be shown."""
        reasons = await self.check(text, sources, agent, said=said)
        attempt = sum(1 for e in trace if e["gate"] in ("validate", "model"))
        trace.append(_entry("fallback", attempt, "extractive" if quoted else "deferral", reasons))
        return not reasons

    async def run(
        self,
        plan: GatePlan,
        agent: Agent,
        question: str,
        sources: list[S],
        *,
        write: Callable[[list[S], list[ChatMessage]], Awaitable[tuple[D, list[S]]]],
        search_again: Callable[[str | None], Awaitable[list[S]]],
        trace: list[dict[str, Any]],
        model_call: Callable[[], AbstractAsyncContextManager[None]] = nullcontext,
    ) -> Gated[D, S]:
        """Drafts written by ``write(sources, correction)`` (a draft and the sources it
        answered from) until one passes or the retries are spent (then ``draft`` is None: the
        caller falls back). A critic's rejection searches again (``search_again(hint)``)
        before the next draft. The critic is asked within ``model_call()`` (the agent's
        model limits)."""
        gated: Gated[D, S] = Gated(None, sources)
        correction: list[ChatMessage] = []
        retried: set[str] = set()
        while True:
            draft, gated.sources = await write(gated.sources, correction)
            gated.drafts.append(draft)
            attempt = len(gated.drafts)
            if draft.error is not None:
                # A failed first draft is the turn's error; a failed retry falls back.
                trace.append(_entry("model", attempt, "failed", [draft.error]))
                gated.draft = draft if attempt == 1 else None
                return gated
            if draft.leaked:
                gated.draft = draft  # the guard's refusal: nothing of the draft is shown
                return gated
            reasons = await self.check(draft.text, gated.sources, agent, said=question)
            trace.append(_entry("validate", attempt, "failed" if reasons else "passed", reasons))
            gate, hint = "validate", None
            if not reasons and plan.critic is not None:
                async with model_call():
                    verdict = await plan.critic.review(
                        question, draft.text, _for_critic(gated.sources)
                    )
                trace.append(_critic_entry(attempt, verdict, plan.critic.model))
                reasons = list(verdict.reasons) if verdict.status == "failed" else []
                gate, hint = "critic", verdict.hint
            if not reasons:
                gated.draft, gated.passed = draft, True
                return gated
            if gate in retried or attempt >= MAX_DRAFTS:
                return gated
            retried.add(gate)
            if gate == "critic":
                gated.sources = await search_again(hint)
                trace.append(
                    _entry(
                        "retrieval",
                        attempt,
                        "again",
                        query=hint,
                        sources=[s.url for s in gated.sources],
                    )
                )
            correction = rejection(draft.text, reasons, question)


def _for_critic(sources: Sequence[SourceRef]) -> list[CriticSource]:
    return [CriticSource(s.id, s.url, s.title, s.text) for s in sources]


def _critic_entry(attempt: int, verdict: Verdict, model: str) -> dict[str, Any]:
    reasons = list(verdict.reasons) or ([verdict.detail] if verdict.detail else [])
    return _entry("critic", attempt, verdict.status, reasons, model=model)


# -- which sources are shown ------------------------------------------------------------

_CITATION = re.compile(r"\[(\d+)\](?!\()")
_CITATION_RUN = re.compile(r"\[\d+\](?!\()(?:[ \t]*\[\d+\](?!\())*")
_SPACED_CITATION = re.compile(r"[ \t]*\[\d+\](?!\()")


def display(
    answer: str,
    cited: Mapping[int, int],
    urls: Mapping[int, str],
    *,
    passed: bool,
    site_url: str | None,
) -> tuple[str, dict[int, int]]:
    """The answer and its shown sources after the source-display gate. ``cited`` maps each
    citation of the answer (1..n) to its source's number in the prompt, ``urls`` those to
    their addresses. An answer that failed the gates shows no sources (and so cites none);
    sources of one address are shown once, the answer's citations merged to match."""
    if not passed:
        return re.sub(r"[ \t]+([.,;:!?])", r"\1", _SPACED_CITATION.sub("", answer)), {}
    merged: dict[int, int] = {}
    kept: dict[str, int] = {}
    shown: dict[int, int] = {}
    for new, old in sorted(cited.items()):
        key = url_key(urls[old], site_url)
        if key not in kept:
            kept[key] = len(kept) + 1
            shown[kept[key]] = old
        merged[new] = kept[key]
    if len(shown) == len(cited):
        return answer, dict(cited)

    def renumber(match: re.Match[str]) -> str:
        run = match.group()
        numbers = sorted({merged.get(int(n), int(n)) for n in _CITATION.findall(run)})
        return (" " if re.search(r"\s", run) else "").join(f"[{n}]" for n in numbers)

    return _CITATION_RUN.sub(renumber, answer), shown
