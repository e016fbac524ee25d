"""`AnswerPipeline`: the one way every channel gets an answer, as a stream of turn events."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field, replace
from datetime import UTC, datetime
from typing import Any

from core.answer.answer_cache import AnswerCache
from core.answer.confidence import Ranking, Signals, confidence
from core.answer.curated import match_curated
from core.answer.escalation import HandoffPolicy, asks_for_person
from core.answer.explore import Explorer, explores
from core.answer.extractive import ExtractiveAnswer, Passage, extractive_answer, subject_of
from core.answer.gaps import gap_reason
from core.answer.gates import AnswerGates, display
from core.answer.guard import StreamGuard
from core.answer.phrases import deferral
from core.answer.postprocess import postprocess
from core.answer.prompt import PromptInput, PromptSource, build_messages, secret_text
from core.answer.question import Question, guess_language, name_found
from core.answer.quotas import Quotas, QuotaState
from core.answer.related import offer_related
from core.answer.rewrite import QueryRewriter
from core.answer.smalltalk import preferred_languages, small_talk
from core.answer.sources import SourceRef, cited_first
from core.answer.support import support
from core.answer.translate import QueryTranslator
from core.deferrals import is_deferred
from core.errors import ModelFailed, Unavailable
from core.llm.limits import ModelLimits
from core.locale import detect_language, language_of, locale_from_url
from core.memory import ConversationMemory
from core.ports import ChatMessage, ChatModel, Embedder, Usage
from core.retrieval.boosts import same_page
from core.retrieval.retriever import Hit, RetrievalQuery, Retriever
from core.slots import network_wait
from core.store.agents import Agent, Agents
from core.store.conversations import Conversations, TurnRecord
from core.store.curated import CuratedAnswers
from core.store.handoff import UNREACHABLE, HandoffStore
from core.store.piece_vectors import PieceVectors
from core.turns import TurnEvent, TurnOutput, TurnRequest

log = logging.getLogger(__name__)

# Question-to-statement similarity with the bundled encoder is lower than question-to-question
# (a right sentence scores about 0.3); below this a sentence is not quoted as an answer.
EXTRACTIVE_MIN_SIMILARITY = 0.28
# Below this estimated probability of being right, an answer is flagged low_confidence (and
# the extractive answerer defers); agents may set their own in settings["answer_threshold"].
# Chosen on the shop and the Corona-Warn-App FAQ together (bench.fit_confidence): the lowest
# bar at which the FAQ's answerable questions get at most 0.05 confidently wrong answers
# (0.03) while the shop keeps its share answered right (0.78); at 0.5 the FAQ would get 0.06
# wrong, at 0.6 the shop would drop to 0.74. Above one half: a wrong answer misleads a
# visitor more than a deferral to a person does.
ANSWER_THRESHOLD = 0.55
# The best pages are read whole for a quote: the retrieved chunk shows which page answers,
# the answer itself may sit in a table or a list next to it.
WHOLE_PAGES = 3


@dataclass(frozen=True, slots=True)
class PipelineConfig:
    rewrite_model: str | None = None
    rewrite_timeout_ms: int = 1500
    max_sources: int = 5
    max_tokens: int = 700
    temperature: float = 0.2
    max_words: int = 150
    # Canned and extractive answers exist at once; they are sent a few words at a time with
    # this pause so the visitor sees them being written, like a model's.
    pace_seconds: float = 0.03
    # The answer gates' critic (core/answer/gates.py): its model, and how long it may take.
    critic_model: str | None = None
    critic_timeout_ms: int = 8000
    # The quote reads the vectors of the sources' pieces stored at ingest; False encodes
    # them all on every turn, as before they were stored (a benchmark's baseline).
    stored_pieces: bool = True


@dataclass(frozen=True, slots=True)
class TurnOutcome:
    answer: str
    mode: str
    sources: tuple[SourceRef, ...] = ()
    citations: tuple[int, ...] = ()
    confidence: float | None = None
    low_confidence: bool = False
    conversation_id: int | None = None
    turn_id: int | None = None
    error: str | None = None
    # With an error: whether the same turn may work later (the model was down or busy), and
    # what failed, for the operator.
    error_transient: bool = True
    error_detail: str = ""
    searched: str | None = None  # the self-contained search query, when it differs


class _Output:
    """Wraps the channel's output: after the visitor has gone, events are dropped quietly."""

    def __init__(self, output: TurnOutput) -> None:
        self._output = output
        self.gone = False

    async def emit(self, event: TurnEvent) -> None:
        if self.gone:
            return
        try:
            await self._output.emit(event)
        except (ConnectionResetError, ConnectionError):
            self.gone = True
            log.info("turn.client.gone event=%s", event.kind)


class _Held:
    """Where a held draft is written: its status events ("reading Shipping") reach the
    visitor, its words wait until the answer is accepted."""

    def __init__(self, out: _Output) -> None:
        self._out = out

    async def emit(self, event: TurnEvent) -> None:
        if event.kind == "status":
            await self._out.emit(event)


@dataclass
class _Trace:
    started: float = field(default_factory=time.perf_counter)
    timings: dict[str, float] = field(default_factory=dict)
    data: dict[str, Any] = field(default_factory=dict)
    done: dict[str, Any] = field(default_factory=dict)  # more fields of the done event
    quota: QuotaState | None = None  # where the visitor and agent stood before the turn
    ranked: tuple[Hit, ...] = ()  # what retrieval ranked, for the confidence estimate

    def lap(self, name: str, since: float) -> None:
        self.timings[name] = round((time.perf_counter() - since) * 1000, 2)

    def export(self) -> dict[str, Any]:
        self.timings["total"] = round((time.perf_counter() - self.started) * 1000, 2)
        return {**self.data, "timings_ms": self.timings}


def _sources(hits: Sequence[Hit], limit: int) -> list[SourceRef]:
    """The chunks grouped by page: one numbered source per page, best first."""
    by_page: dict[str, list[Hit]] = {}
    for hit in hits:
        by_page.setdefault(hit.url, []).append(hit)
    sources = []
    for number, hits in enumerate(list(by_page.values())[:limit], start=1):
        best = hits[0]
        text = "\n\n".join(h.text for h in sorted(hits, key=lambda h: h.chunk_id))
        sources.append(
            SourceRef(
                number, best.url, best.title, round(best.match, 4), text, best.locale, best.page_id
            )
        )
    return sources


def _names_found(names: Sequence[str], hits: Sequence[Hit]) -> bool:
    """Whether a page about any of ``names`` ("Waddenhuis 2") is among the hits: its title
    names it (a passing mention elsewhere is no page about it)."""
    return any(name_found(name, h.title) for name in names for h in hits)


def _tags(agent_tags: object, request_tags: Sequence[str]) -> tuple[str, ...]:
    """The agent's tag filter (a list in its settings) joined with the request's."""
    own = [str(t) for t in agent_tags] if isinstance(agent_tags, list | tuple) else []
    return tuple(sorted({t.lower() for t in [*own, *request_tags]}))


# The channels whose readers see an answer as it is written (Server-Sent Events); the others
# send it whole, so holding it until it is checked costs them nothing but a retry's time.
STREAMED = frozenset({"web", "playground"})

# Turns staff or the nightly checks ask, not customers: they cost nothing and are no gaps.
REHEARSALS = frozenset({"playground", "test"})


def _record(request: TurnRequest, agent: Agent, language: str, **outcome: Any) -> TurnRecord:
    """What a turn saves: who asked what where, plus the ``outcome`` fields of the answer."""
    return TurnRecord(
        agent_id=agent.id,
        channel=request.channel,
        conversation_key=request.conversation_key,
        question=request.text,
        save_question=not request.already_saved,
        language=language,
        count_usage=request.channel not in REHEARSALS,
        trace={},  # filled in by _conclude, once the timings are complete
        **outcome,
    )


def _word_chunks(text: str) -> list[str]:
    """Canned and extractive answers stream a few words at a time, like a model would."""
    words = text.split(" ")
    return [
        " ".join(words[i : i + 3]) + (" " if i + 3 < len(words) else "")
        for i in range(0, len(words), 3)
    ]


class AnswerPipeline:
    def __init__(
        self,
        *,
        agents: Agents,
        conversations: Conversations,
        memory: ConversationMemory,
        curated: CuratedAnswers,
        retriever: Retriever,
        embedder: Embedder,
        chat: ChatModel | None,
        rewriter: QueryRewriter,
        config: PipelineConfig,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        handoff: HandoffStore | None = None,
        limits: ModelLimits | None = None,
        answer_cache: AnswerCache | None = None,
        quotas: Quotas | None = None,
        translator: QueryTranslator | None = None,
        explorer: Explorer | None = None,
        pieces: PieceVectors | None = None,
    ) -> None:
        self._agents = agents
        self._conversations = conversations
        self._memory = memory
        self._curated = curated
        self._retriever = retriever
        self._embedder = embedder
        self._chat = chat
        self._rewriter = rewriter
        self._config = config
        self._clock = clock
        self._handoff = handoff
        self._limits = limits or ModelLimits()
        self._answer_cache = answer_cache
        self._quotas = quotas
        self._translator = translator
        self._explorer = explorer  # for agents that answer by exploring their pages
        self._pieces = pieces if config.stored_pieces else None
        self._gates = AnswerGates(
            retriever,
            chat,
            critic_model=config.critic_model,
            critic_timeout=config.critic_timeout_ms / 1000,
        )

    @property
    def memory(self) -> ConversationMemory:
        return self._memory

    @property
    def retriever(self) -> Retriever:
        return self._retriever

    async def run(self, request: TurnRequest, output: TurnOutput) -> TurnOutcome:
        out = _Output(output)
        trace = _Trace()
        await out.emit(TurnEvent.status("searching"))
        agent = await self._agents.get(request.agent)
        handed_off = await self._handoff_turn(request, agent, out, trace)
        if handed_off is not None:
            return handed_off
        talk = small_talk(request.text)
        if talk is not None:  # nothing but hello, thanks or goodbye: no search, no model
            spoken = await self._conversations.language(
                agent.id, request.channel, request.conversation_key
            )
            language = talk.language(preferred_languages(request, agent, spoken))
            trace.data.update({"query": request.text, "language": language,
                               "channel": request.channel, "small_talk": talk.kind})  # fmt: skip
            reply = talk.reply(language)
            return await self._finish_canned(
                request, agent, out, trace, reply, language, mode="smalltalk", confidence=None
            )
        # The question's vector is made while the conversation is looked up: the answer
        # cache and the search ask for it next.
        self._retriever.warm(request.text)
        conversation_id = await self._conversations.find(
            agent.id, request.channel, request.conversation_key
        )
        memory = await self._memory.recall(conversation_id)
        history = memory.history
        if request.previous_messages is not None:
            # The caller keeps the conversation: what it sends stands for the memory.
            memory = replace(memory, messages=(), summary=None)
            history = [(role, text) for role, text in request.previous_messages]
        if request.already_saved and history and history[-1] == ("visitor", request.text):
            history = history[:-1]
        language = self._language(request, agent)
        trace.data.update({"query": request.text, "language": language, "channel": request.channel})
        trace.data["memory"] = memory.describe()
        if self._quotas is not None:
            trace.quota = await self._quotas.check(request, agent, self._clock())
            trace.done["quota"] = trace.data["quota"] = trace.quota.remaining()
            if trace.quota.exhausted:
                text = trace.quota.message(language, agent.contact_route)
                return await self._finish_canned(
                    request, agent, out, trace, text, language, mode="quota", confidence=None
                )

        curated = await match_curated(
            request.text, None, await self._curated.enabled(agent.id), self._embedder
        )
        if curated is not None:
            await self._curated.count_hit(curated.id)
            trace.data["curated_id"] = curated.id
            return await self._finish_canned(request, agent, out, trace, curated.answer, language)
        cache = None
        if self._answer_cache is not None:
            cache = await self._answer_cache.lookup(
                request,
                agent,
                self._retrieval_query(request, agent, request.text, language),
                history,
                subject_of(request.page.title) if request.page and request.page.title else None,
                summary=memory.summary,
            )
            trace.data.update({"answer_cache": cache.verdict, **cache.describe()})
            if cache.hit is not None:
                return await self._finish_canned(
                    request, agent, out, trace, cache.hit.answer, language, mode="cached",
                    confidence=cache.hit.confidence,
                    shown=[SourceRef(int(s["id"]), str(s["url"]), str(s.get("title") or ""),
                                     float(s.get("score") or 0.0), "")
                           for s in cache.hit.sources],
                    cited=cache.hit.citations,
                )  # fmt: skip

        step = time.perf_counter()
        page_title = request.page.title if request.page else None
        rewrite = await self._rewriter.rewrite(
            f"{agent.id}:{request.channel}:{request.conversation_key}",
            request.text,
            history,
            summary=memory.summary,
            page_subject=subject_of(page_title) if page_title else None,
        )
        trace.lap("rewrite", step)
        trace.data.update(
            {
                "rewritten_query": rewrite.query,
                "rewrite": rewrite.method,
                "rewrite_reason": rewrite.reason,
            }
        )

        step = time.perf_counter()
        question = Question.read(rewrite.query, language, latest=request.text)
        # What the answer may name besides the sources' words: what the visitor wrote, never
        # the page title the search query was filled in from (the page's, or a forged one).
        said = " ".join([*(text for role, text in history if role == "visitor"), request.text])
        query = self._retrieval_query(request, agent, rewrite.query, language)
        if self._translator is not None:  # searched in the knowledge's language (optional)
            query, translated = await self._translator.translated(query, language)
            trace.data.update(translated)
        result = await self._retriever.retrieve(query)
        if question.names and not _names_found(question.names, result.hits):
            # The product asked about may be described only in another language's folder.
            wider = await self._retriever.retrieve(replace(query, language_folders=False))
            if _names_found(question.names, wider.hits):
                result = wider
                trace.data["language_folders"] = "all"
        trace.lap("retrieve", step)
        trace.ranked = result.ranked
        trace.data["retrieved"] = [
            {"chunk_id": h.chunk_id, "url": h.url, "match": h.match, "score": h.score,
             "boost": h.boost, "reasons": list(h.reasons), "passed": h in result.hits}
            for h in result.ranked[:10]
        ]  # fmt: skip
        # Without a model, the best candidates are read even below the bar: the estimate of
        # the quote's confidence, not the match alone, decides whether it is said.
        candidates = result.hits or (result.ranked if self._chat is None else ())
        sources = _sources(candidates, self._max_sources(request))
        leans = rewrite.method != "verbatim" and subject_of(page_title or "") in rewrite.query
        if page_title and (leans or question.points):
            # about the page the visitor is on ("and how much is it?", "is this waterproof?")
            sources = await self._with_current_page(request, agent, sources)
        match = result.confidence or 0.0
        threshold = float(agent.settings.get("answer_threshold", ANSWER_THRESHOLD))
        await out.emit(TurnEvent.status("reading"))

        if self._chat is None:
            quote, estimate = await self._estimate(
                request, agent, question, sources, match, trace, said
            )
            low_confidence = estimate < threshold
            await out.emit(TurnEvent.status("answering"))
            step = time.perf_counter()
            answered = quote.answered and not low_confidence
            text = quote.text if answered else deferral(language, agent.contact_route)
            # The whole answer is known before it is sent: number its sources 1, 2, ... now,
            # so what streams is what is stored.
            text, sources = cited_first(text, sources)
            await self._paced(text, out)
            generated = _Generated(text=text, mode="extractive", deferred=not answered)
        else:
            await out.emit(TurnEvent.status("answering"))
            step = time.perf_counter()
            generated, sources = await self._gated(
                request, agent, sources, history, memory.summary, language, out, trace,
                question=question, match=match, said=said, threshold=threshold, query=query,
            )  # fmt: skip
        trace.lap("generate", step)
        if generated.error is not None:
            await out.emit(TurnEvent.error(generated.error, generated.message))
            return TurnOutcome(
                answer="",
                mode=generated.mode,
                error=generated.error,
                error_transient=generated.transient,
                error_detail=generated.detail or generated.message,
            )
        if self._chat is not None:
            # Only the stored confidence needs the quote: worked out after the stream, it
            # adds nothing to the time the visitor waits for the first word.
            quote, estimate = await self._estimate(
                request, agent, question, sources, match, trace, said
            )
            processed = postprocess(generated.text, len(sources), [s.text for s in sources])
            # What failed validation as written may be mended by post-processing (a citation
            # out of range dropped, a copied tag removed): only what is still wrong withdraws.
            mended = generated.passed or not await self._gates.check(
                processed.text, sources, agent, said=request.text
            )
            broken = _broken(generated, processed.text, mended)
            if broken is not None:
                # Nothing broken reaches the visitor: the sources' confident quote, else the
                # deferral, in its place; what the model wrote stays in the trace for staff.
                log.info("turn.answer.withdrawn agent=%s reason=%s", agent.slug, broken)
                trace.data["withdrawn"] = {"reason": broken, "text": generated.text[:2000]}
                generated, sources, estimate = await self._replacement(
                    generated, quote, estimate, sources, agent, language, threshold, trace
                )
            elif generated.mode in WRITTEN and not is_deferred(processed.text):
                # As sure as the sources answer the question, and as far as they carry what
                # the model wrote.
                carried = await support(
                    processed.text, _cited(sources, processed.citations), self._embedder,
                    self._pieces,
                )  # fmt: skip
                trace.data["support"] = carried.as_dict()
                estimate = round(estimate * carried.share, 4)
            low_confidence = estimate < threshold

        processed = postprocess(generated.text, len(sources), [s.text for s in sources])
        answer = processed.text if not generated.leaked else generated.text
        cited = processed.citations if not generated.leaked else ()
        # What the visitor sees as sources: those the answer cites (none when it cites none),
        # numbered as the answer now cites them.
        renumbered = (
            {} if generated.leaked else dict(zip(cited, processed.source_numbers, strict=True))
        )
        # Sources only for an answer that passed its gates, each address once.
        answer, renumbered = display(
            answer, renumbered, {s.id: s.url for s in sources}, passed=generated.passed,
            site_url=agent.site_url,
        )  # fmt: skip
        cited = tuple(renumbered)
        by_number = {s.id: s for s in sources}
        shown = [replace(by_number[old], id=new) for new, old in renumbered.items()]
        trace.data.update(
            {
                # Numbered as in the prompt; "cited_sources" maps each citation to one of them.
                "sources": [s.public() for s in sources],
                "citations": list(cited),
                "cited_sources": {str(new): old for new, old in renumbered.items()},
                "disconnected": out.gone,
                "guard": "leak"
                if trace.data.get("withdrawn", {}).get("reason") == "recital"
                else "ok",
                "model": generated.model,
                "usage": generated.usage_dict(),
            }
        )
        if generated.held or (generated.replaced and not generated.shown):
            # written in full and checked, or put in place of a withdrawn answer nothing of
            # which was shown: now the visitor reads it
            await self._paced(answer, out)
        outcome = await self._conclude(
            request,
            out,
            trace,
            _record(
                request,
                agent,
                language,
                answer=answer,
                rewritten_query=rewrite.query if rewrite.method != "verbatim" else None,
                confidence=estimate,
                low_confidence=low_confidence,
                mode=generated.mode,
                prompt_tokens=generated.usage.prompt_tokens if generated.usage else 0,
                completion_tokens=generated.usage.completion_tokens if generated.usage else 0,
                gap_reason=(
                    gap_reason(answer, low_confidence)
                    if request.channel not in REHEARSALS
                    else None
                ),
            ),
            shown,
            cited,
            deferred=generated.deferred or is_deferred(answer),
            searched=rewrite.query if rewrite.method != "verbatim" else None,
            related=None if generated.leaked else query,
        )
        if cache is not None and self._answer_cache is not None and not generated.leaked:
            await self._answer_cache.store(
                cache, request, mode=outcome.mode, answer=outcome.answer,
                sources=[s.public() for s in outcome.sources], citations=outcome.citations,
                confidence=outcome.confidence, low_confidence=outcome.low_confidence,
                deferred=generated.deferred or is_deferred(answer), complete=not out.gone,
                passed=generated.passed,
            )  # fmt: skip
        return outcome

    async def _replacement(
        self,
        generated: _Generated,
        quote: ExtractiveAnswer,
        estimate: float,
        sources: list[SourceRef],
        agent: Agent,
        language: str,
        threshold: float,
        trace: _Trace,
    ) -> tuple[_Generated, list[SourceRef], float]:
        """What the visitor gets instead of a broken answer: the sources' quote when it is
        confident, else the deferral with the contact route; and the sources and the
        confidence that go with it."""
        quoted = quote.answered and estimate >= threshold
        text = quote.text if quoted else deferral(language, agent.contact_route)
        text, sources = cited_first(text, sources)
        record: list[dict[str, Any]] = trace.data.setdefault("gates", [])
        passed = await self._gates.fallback(
            text, sources, agent, record, quoted=quoted, said=trace.data.get("query", "")
        )
        replaced = replace(
            generated, text=text, mode="extractive", leaked=False, deferred=not quoted,
            passed=passed, replaced=True, sources=None,
        )  # fmt: skip
        return replaced, sources, estimate if quoted else 0.0

    async def _conclude(
        self,
        request: TurnRequest,
        out: _Output,
        trace: _Trace,
        record: TurnRecord,
        shown: Sequence[SourceRef],
        cited: tuple[int, ...],
        *,
        deferred: bool = False,
        searched: str | None = None,
        related: RetrievalQuery | None = None,
    ) -> TurnOutcome:
        """Sources, related reading (pages for ``related``, the answer's search, that it did
        not show), then the turn saved (after the stream, never during it), then done."""
        await out.emit(TurnEvent("sources", {"sources": [s.public() for s in shown]}))
        trace.data.update(
            await offer_related(
                self._retriever, None if out.gone else related, [s.url for s in shown], out,
                channel=request.channel, deferred=deferred,
            )
        )  # fmt: skip
        exported = trace.export()
        if request.voice:
            # Voice notes answered: staff read the transcript beside the audio's link.
            exported["voice"] = [dict(v) for v in request.voice]
        saved = await self._conversations.save_turn(replace(record, trace=exported))
        if self._quotas is not None and trace.quota is not None:
            await self._quotas.spend(trace.quota, record.mode)
        await out.emit(
            TurnEvent(
                "done",
                {
                    "conversation_id": saved.conversation_id,
                    "turn_id": saved.turn_id,
                    "confidence": record.confidence,
                    "low_confidence": record.low_confidence,
                    "citations": list(cited),
                    "answer": record.answer,
                    "mode": record.mode,
                    "deferred": deferred,
                    "cached": record.mode == "cached",
                    **trace.done,
                },
            )
        )
        await self._memory.remember(saved.conversation_id, saved.generation, saved.messages)
        return TurnOutcome(
            answer=record.answer,
            mode=record.mode,
            sources=tuple(shown),
            citations=cited,
            confidence=record.confidence,
            low_confidence=record.low_confidence,
            conversation_id=saved.conversation_id,
            turn_id=saved.turn_id,
            searched=searched,
        )

    async def _handoff_turn(
        self, request: TurnRequest, agent: Agent, out: _Output, trace: _Trace
    ) -> TurnOutcome | None:
        """Staff have the conversation (or the visitor waits for them): the message is kept
        for staff and the bot says nothing. A visitor asking for a person is told one will
        come (or when), and the conversation waits for staff. None: the bot answers."""
        if self._handoff is None or request.channel == "api":
            return None  # an API caller has no way to hear from staff
        reachable = request.channel not in UNREACHABLE
        if reachable:
            state = await self._handoff.state(agent.id, request.channel, request.conversation_key)
            if state is not None and state.held:
                held = await self._handoff.hold(
                    agent_id=agent.id,
                    channel=request.channel,
                    key=request.conversation_key,
                    question=request.text,
                    save_question=not request.already_saved,
                    language=None,
                    trace={"held": state.status, "channel": request.channel},
                )
                await out.emit(TurnEvent("sources", {"sources": []}))
                await out.emit(
                    TurnEvent(
                        "done",
                        {
                            "conversation_id": held.conversation_id,
                            "turn_id": held.turn_id,
                            "confidence": None,
                            "low_confidence": False,
                            "citations": [],
                            "answer": "",
                            "mode": "staff",
                            "handoff": state.status,
                        },
                    )
                )
                return TurnOutcome(
                    answer="",
                    mode="staff",
                    conversation_id=held.conversation_id,
                    turn_id=held.turn_id,
                )
        policy = HandoffPolicy.of(agent.settings, agent.timezone, agent.default_language)
        if not policy.enabled or not asks_for_person(request.text):
            return None
        language = self._language(request, agent)
        text, staffed = policy.reply(language, self._clock())
        trace.data.update(
            {"query": request.text, "language": language, "channel": request.channel,
             "handoff": "requested", "staffed": staffed}
        )  # fmt: skip
        await out.emit(TurnEvent.status("answering"))
        await self._paced(text, out)
        record = _record(
            request, agent, language, answer=text, rewritten_query=None, confidence=None,
            low_confidence=False, mode="handoff",
        )  # fmt: skip
        outcome = await self._conclude(request, out, trace, record, (), ())
        if reachable and outcome.conversation_id is not None:
            await self._handoff.change_status(
                outcome.conversation_id,
                "waiting_for_staff",
                author=None,
                unless=("staff", "waiting_for_staff"),
            )
        return outcome

    def _language(self, request: TurnRequest, agent: Agent) -> str:
        """The reply language: what the visitor wrote in, else the page's language."""
        if request.overrides and request.overrides.get("language"):
            return language_of(str(request.overrides["language"]))
        written = detect_language(request.text) or guess_language(request.text)
        if written:
            return written
        if request.language:
            return language_of(request.language)
        folder = locale_from_url(request.page.url) if request.page and request.page.url else None
        return language_of(folder) if folder else language_of(agent.default_language)

    def _retrieval_query(
        self, request: TurnRequest, agent: Agent, text: str, language: str
    ) -> RetrievalQuery:
        return RetrievalQuery(
            agent=agent,
            text=text,
            k=self._max_sources(request) * 2,
            page_url=request.page.url if request.page else None,
            reply_language=language,
            include_tags=_tags(agent.settings.get("include_tags"), request.include_tags),
            exclude_tags=_tags(agent.settings.get("exclude_tags"), request.exclude_tags),
        )

    def _max_sources(self, request: TurnRequest) -> int:
        return request.max_results or self._config.max_sources

    async def _finish_canned(
        self,
        request: TurnRequest,
        agent: Agent,
        out: _Output,
        trace: _Trace,
        text: str,
        language: str,
        *,
        mode: str = "curated",
        confidence: float | None = 1.0,
        shown: Sequence[SourceRef] = (),
        cited: tuple[int, ...] = (),
    ) -> TurnOutcome:
        """An answer known at once (curated, small talk, quota, cached), paced like a model's."""
        await out.emit(TurnEvent.status("answering"))
        await self._paced(text, out)
        return await self._conclude(
            request,
            out,
            trace,
            _record(
                request,
                agent,
                language,
                answer=text,
                rewritten_query=None,
                confidence=confidence,
                low_confidence=False,
                mode=mode,
            ),
            shown,
            cited,
        )

    async def _with_current_page(
        self, request: TurnRequest, agent: Agent, sources: list[SourceRef]
    ) -> list[SourceRef]:
        """A question about the page the visitor is on ("and how much is it?") is answered
        from that page too, even when the search ranked it below others."""
        url = request.page.url if request.page else None
        if not url or any(same_page(s.url, url) for s in sources):
            return sources
        page = await self._retriever.page_at(agent, url)
        if page is None:
            return sources
        text = (await self._retriever.page_texts(agent.id, [page.page_id])).get(page.page_id, "")
        number = len(sources) + 1
        return [
            *sources,
            SourceRef(number, page.url, page.title, 0.0, text, page.locale, page.page_id),
        ]

    async def _estimate(
        self,
        request: TurnRequest,
        agent: Agent,
        question: Question,
        sources: list[SourceRef],
        match: float,
        trace: _Trace,
        said: str,
    ) -> tuple[ExtractiveAnswer, float]:
        """The quote and the estimated probability that an answer from these sources is right
        (the signals are recorded in the trace); ``said``: what the visitor wrote."""
        step = time.perf_counter()
        quote = await self._quote(request, agent, question, sources, said)
        answering = sources[quote.citations[0] - 1].url if quote.citations else None
        signals = Signals.of(
            quote.evidence, match, bool(question.wants), question.yes_no,
            Ranking.of(trace.ranked, answering),
        )  # fmt: skip
        trace.lap("quote", step)
        trace.data["confidence_signals"] = signals.as_dict()
        return quote, confidence(signals) if quote.answered else 0.0

    async def _quote(
        self,
        request: TurnRequest,
        agent: Agent,
        question: Question,
        sources: Sequence[SourceRef],
        said: str,
    ) -> ExtractiveAnswer:
        """The sources' own words that answer: the extractive answer, and the evidence the
        confidence estimate rests on with or without a model."""
        page_url = request.page.url if request.page else None
        whole = await self._retriever.page_texts(
            agent.id, [s.page_id for s in sources[:WHOLE_PAGES] if s.page_id is not None]
        )
        passages = [
            Passage(
                s.title,
                whole.get(s.page_id or 0, s.text),
                language_of(s.locale) if s.locale else None,
                current=page_url is not None and same_page(s.url, page_url),
                page_id=s.page_id,
            )
            for s in sources
        ]
        return await extractive_answer(
            question,
            passages,
            self._embedder,
            contact_route=agent.contact_route,
            min_similarity=EXTRACTIVE_MIN_SIMILARITY,
            fallback_languages=(language_of(agent.default_language),),
            said=said,
            stored=self._pieces,
        )

    async def _paced(self, text: str, out: _Output) -> None:
        for number, piece in enumerate(_word_chunks(text)):
            if number and self._config.pace_seconds:
                await asyncio.sleep(self._config.pace_seconds)
            await out.emit(TurnEvent.token(piece))
            if out.gone:
                return

    async def _gated(
        self,
        request: TurnRequest,
        agent: Agent,
        sources: list[SourceRef],
        history: Sequence[tuple[str, str]],
        summary: str | None,
        language: str,
        out: _Output,
        trace: _Trace,
        *,
        question: Question,
        match: float,
        said: str,
        threshold: float,
        query: RetrievalQuery,
    ) -> tuple[_Generated, list[SourceRef]]:
        """The model's answer through the answer gates (core/answer/gates.py), and the sources
        it answered from. Held by the agent's gates, it is written in full and checked before
        the visitor sees it (a rejected one is written once more, then replaced by the
        sources' quote or a deferral); else it streams and its verdict is only recorded."""
        record: list[dict[str, Any]] = trace.data.setdefault("gates", [])
        plan = self._gates.plan(agent, streamed=request.channel in STREAMED)
        if not plan.holds:
            generated = await self._generate(
                request, agent, sources, history, summary, language, out, trace
            )
            # An exploration answers from the pages it opened too: those are its sources.
            sources = sources if generated.sources is None else generated.sources
            if generated.error is None and not generated.leaked:
                generated.passed = await self._gates.record(
                    generated.text, sources, agent, record, said=request.text
                )
            return generated, sources

        async def write(
            given: list[SourceRef], correction: list[ChatMessage]
        ) -> tuple[_Generated, list[SourceRef]]:
            held = _Output(_Held(out))  # the visitor sees what it does, none of its words
            draft = await self._generate(
                request, agent, given, history, summary, language, held, trace, correction
            )
            return draft, given if draft.sources is None else draft.sources

        async def search_again(hint: str | None) -> list[SourceRef]:
            wider = replace(query, text=hint or query.text, k=query.k * 2, language_folders=False)
            found = await self._retriever.retrieve(wider)
            return _sources(found.hits, self._max_sources(request)) or sources

        @asynccontextmanager
        async def model_call() -> AsyncIterator[None]:
            # The critic's call waits on the network like the answer's, within the same limits.
            async with network_wait(), self._limits.call(agent.id, agent.settings):
                yield

        gated = await self._gates.run(
            plan, agent, request.text, sources, write=write, search_again=search_again,
            trace=record, model_call=model_call,
        )  # fmt: skip
        if gated.draft is not None:
            gated.draft.passed, gated.draft.held = gated.passed, True
            gated.draft.usage = gated.usage()
            return gated.draft, gated.sources
        quote, estimate = await self._estimate(
            request, agent, question, gated.sources, match, trace, said
        )
        quoted = quote.answered and estimate >= threshold
        text = quote.text if quoted else deferral(language, agent.contact_route)
        text, sources = cited_first(text, gated.sources)
        passed = await self._gates.fallback(
            text, sources, agent, record, quoted=quoted, said=request.text
        )
        fallback = _Generated(
            text=text, mode="extractive", deferred=not quoted, passed=passed, held=True,
            usage=gated.usage(),
        )  # fmt: skip
        return fallback, sources

    async def _generate(
        self,
        request: TurnRequest,
        agent: Agent,
        sources: Sequence[SourceRef],
        history: Sequence[tuple[str, str]],
        summary: str | None,
        language: str,
        out: _Output,
        trace: _Trace,
        correction: Sequence[ChatMessage] = (),
    ) -> _Generated:
        """``correction``: messages after the question (a rejected draft and why)."""
        assert self._chat is not None
        settings = agent.settings
        messages = build_messages(
            PromptInput(
                persona=agent.persona,
                agent_name=agent.name,
                guardrails=str(settings.get("guardrails", "")),
                max_words=int(settings.get("max_words", self._config.max_words)),
                timezone=agent.timezone,
                now=self._clock(),
                page_url=request.page.url if request.page else None,
                page_title=request.page.title if request.page else None,
                page_context=request.page.context if request.page else None,
                custom_prompt=agent.custom_prompt,
                language=language,
                writing_rule=request.writing_rule,
                sources=[PromptSource(s.id, s.url, s.title, s.text) for s in sources],
                history=history,
                summary=summary,
                question=request.text,
            )
        )
        messages += correction
        guard = StreamGuard(secret_text())
        try:
            # The model's wait costs no work slot; the agent's limits are waited for first.
            async with network_wait(), self._limits.call(agent.id, settings):
                if self._explorer is not None and explores(settings):
                    explored = await self._explorer.explore(
                        self._retrieval_query(request, agent, request.text, language),
                        messages, sources, language, emit=out.emit,
                        say=lambda text: self._paced(text, out), trace=trace.data,
                    )  # fmt: skip
                    if explored is None:
                        # It could not explore (the trace says why): the answer is written
                        # from the search results, as for an agent that does not explore.
                        await out.emit(TurnEvent.status("answering"))
                        return await self._stream(agent, messages, language, guard, out, trace)
                    return _Generated(
                        text=explored.text, mode="explore", leaked=explored.leaked,
                        model=self._chat.model, usage=explored.usage, deferred=explored.deferred,
                        sources=explored.sources,
                    )  # fmt: skip
                return await self._stream(agent, messages, language, guard, out, trace)
        except Unavailable as exc:
            # The chat model has logged why; the visitor gets llm_failed and may retry.
            transient = not isinstance(exc, ModelFailed) or exc.transient
            return _Generated.failed(
                "the answer could not be generated",
                self._chat.model,
                transient=transient,
                detail=exc.message,
            )

    async def _stream(
        self,
        agent: Agent,
        messages: Sequence[ChatMessage],
        language: str,
        guard: StreamGuard,
        out: _Output,
        trace: _Trace,
    ) -> _Generated:
        assert self._chat is not None
        answer = ""
        released = 0
        pieces = 0
        usage: Usage | None = None
        first_token: float | None = None
        started = time.perf_counter()
        stream = self._chat.stream(
            messages, max_tokens=self._config.max_tokens, temperature=self._config.temperature
        )

        def written(**fields: Any) -> _Generated:
            # A reply cut short (a recital stopped, a visitor gone) has no usage from the
            # server: it is counted from what was sent and received.
            counted = usage or _estimated_usage(messages, pieces)
            if usage is None:
                trace.data["usage_estimated"] = True
            return _Generated(model=self._chat.model if self._chat else None, usage=counted,
                              shown=released > 0, **fields)  # fmt: skip

        try:
            async for chunk in stream:
                if chunk.thought_seconds is not None:
                    trace.data["thinking_seconds"] = chunk.thought_seconds
                if chunk.usage is not None:
                    usage = chunk.usage
                if not chunk.text:
                    continue
                pieces += 1
                if first_token is None:
                    first_token = time.perf_counter()
                    trace.lap("first_token", started)
                answer += chunk.text
                verdict = guard.check(answer)
                if verdict in ("hold", "wordless"):
                    continue  # (word-less output is withdrawn once it has ended)
                if verdict == "leak":
                    log.warning("turn.guard.leak agent=%s", agent.slug)
                    return written(text=answer, mode="llm", leaked=True)
                # A closing run of words that may begin a recital waits for the next words.
                releasable = guard.releasable(answer)
                if releasable > released:
                    await out.emit(TurnEvent.token(answer[released:releasable]))
                    released = releasable
                if out.gone:
                    break  # the visitor left: stop paying for tokens nobody reads
        finally:
            await stream.aclose()  # type: ignore[attr-defined]
        if guard.check(answer) == "leak":
            return written(text=answer, mode="llm", leaked=True)
        if released and released < len(answer) and not out.gone:
            await out.emit(TurnEvent.token(answer[released:]))
            released = len(answer)
        elif not released and _has_words(answer) and not out.gone:
            await out.emit(TurnEvent.token(answer))
            released = len(answer)
        return written(text=answer, mode="llm")


# The modes in which a model wrote the answer.
WRITTEN = frozenset({"llm", "explore"})
# Characters per token, roughly, across the languages we serve: for usage a server did not
# report (a reply cut short).
_CHARS_PER_TOKEN = 4


def _has_words(text: str) -> bool:
    return any(c.isalnum() for c in text)


def _estimated_usage(messages: Sequence[ChatMessage], pieces: int) -> Usage:
    sent = sum(len(m.content or "") for m in messages)
    return Usage(prompt_tokens=max(1, sent // _CHARS_PER_TOKEN), completion_tokens=pieces)


def _broken(generated: _Generated, processed: str, valid: bool) -> str | None:
    """Why a model's answer may not stand (None: it may): it recites the prompt, holds no
    words, is nothing but markup once post-processed, or is not ``valid`` even then."""
    if generated.mode not in WRITTEN or generated.replaced:
        return None
    if generated.leaked:
        return "recital"
    if not _has_words(generated.text):
        return "empty"
    if not _has_words(processed):
        return "markup"
    if not valid:
        return "validation"
    return None


def _cited(sources: Sequence[SourceRef], citations: Sequence[int]) -> list[Passage]:
    by_number = {s.id: s for s in sources}
    return [
        Passage(s.title, s.text, page_id=s.page_id)
        for n in dict.fromkeys(citations)
        if (s := by_number.get(n)) is not None
    ]


@dataclass
class _Generated:
    text: str
    mode: str
    leaked: bool = False
    model: str | None = None
    usage: Usage | None = None
    error: str | None = None
    message: str = ""
    deferred: bool = False
    transient: bool = True  # with an error: whether a later try may work
    detail: str = ""
    sources: list[SourceRef] | None = None  # the sources it answered from, when not the given
    # The answer gates: whether it passed them (its sources may be shown), and whether it was
    # held back until checked (then it is sent after, paced).
    passed: bool = True
    held: bool = False
    shown: bool = False  # some of it reached the visitor as it streamed
    replaced: bool = False  # the sources' quote or the deferral, in place of a broken answer

    @classmethod
    def failed(
        cls, message: str, model: str, *, transient: bool = True, detail: str = ""
    ) -> _Generated:
        return cls(
            text="",
            mode="llm",
            model=model,
            error="llm_failed",
            message=message,
            transient=transient,
            detail=detail,
        )

    def usage_dict(self) -> dict[str, int] | None:
        if self.usage is None:
            return None
        return {
            "prompt_tokens": self.usage.prompt_tokens,
            "completion_tokens": self.usage.completion_tokens,
        }
