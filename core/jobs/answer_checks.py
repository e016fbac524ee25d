"""The nightly answer checks: each agent's test questions asked through the answer pipeline.

A check passes when every expected fact appears in the answer (case-insensitive, spacing
ignored) and, when it names a URL, the answer cites that page. Each question is asked in a
conversation of its own on the ``test`` channel, so checks never see each other's history.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit, urlunsplit

from core.answer.pipeline import AnswerPipeline
from core.jobs.scheduler import JobResult
from core.store.agents import Agents
from core.store.answer_checks import AnswerCheck, AnswerChecks, NewResult
from core.store.job_runs import JobRun
from core.turns import CollectingTurnOutput, TurnRequest

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class Verdict:
    passed: bool
    missing_facts: tuple[str, ...]
    cited_ok: bool | None  # None when the check names no URL


def _plain(text: str) -> str:
    return " ".join(text.casefold().split())


def _url_key(url: str) -> str:
    """Scheme and host case, a trailing slash and a fragment make no difference."""
    parts = urlsplit(url.strip())
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, parts.query, ""))


def evaluate(check: AnswerCheck, answer: str, cited_urls: Iterable[str]) -> Verdict:
    text = _plain(answer)
    missing = tuple(fact for fact in check.expected_facts if _plain(fact) not in text)
    cited_ok = None
    if check.must_cite is not None:
        cited_ok = _url_key(check.must_cite) in {_url_key(url) for url in cited_urls}
    return Verdict(not missing and cited_ok is not False, missing, cited_ok)


async def run_answer_checks(
    checks: AnswerChecks, agents: Agents, pipeline: AnswerPipeline, run: JobRun
) -> JobResult:
    """Ask every check's question and file the results under ``run``."""
    passed = failed = 0
    agent_ids = await checks.agents_with_checks()
    for agent_id in agent_ids:
        agent = await agents.by_id(agent_id)
        for check in await checks.list(agent_id):
            result = await _ask(pipeline, agent.slug, check, run.id)
            await checks.record(run.id, result)
            passed += result.passed
            failed += not result.passed
    return JobResult(
        f"{passed + failed} checks of {len(agent_ids)} agents: {passed} passed, {failed} failed",
        {"checks": passed + failed, "passed": passed, "failed": failed, "agents": len(agent_ids)},
    )


async def _ask(pipeline: AnswerPipeline, agent: str, check: AnswerCheck, run_id: int) -> NewResult:
    output = CollectingTurnOutput()
    try:
        request = TurnRequest(
            agent=agent,
            channel="test",
            conversation_key=f"answer-check:{check.id}:{run_id}",
            text=check.question,
            language=check.language,
        )
        await pipeline.run(request, output)
    except Exception as exc:
        # One broken check must not cost the others their run; the result records why.
        log.exception("answer_checks.error check=%d", check.id)
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        return NewResult(check.id, check.agent_id, passed=False, answer="", error=reason)
    done, error = output.done, output.error
    if error is not None or done is None:
        code = str(error["code"]) if error else "no_answer"
        return NewResult(
            check.id, check.agent_id, passed=False, answer=output.streamed_text, error=code
        )
    answer = str(done["answer"])
    cited = tuple(str(source["url"]) for source in output.sources)
    verdict = evaluate(check, answer, cited)
    return NewResult(
        check.id,
        check.agent_id,
        passed=verdict.passed,
        answer=answer,
        missing_facts=verdict.missing_facts,
        cited_urls=cited,
        cited_ok=verdict.cited_ok,
        confidence=done.get("confidence"),
        turn_id=done.get("turn_id"),
    )
