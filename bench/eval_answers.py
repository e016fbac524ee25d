"""Answer quality on the bundled shop: does the reply contain the fact, is the unanswerable
deferred, and does `confidence` tell right answers from wrong ones.

    .venv/bin/python -m bench.eval_answers               # embedded PostgreSQL in a temp dir
    .venv/bin/python -m bench.eval_answers --show wrong  # print every wrong answer too

Ingests `bench/data/shop/` and asks every question of `bench/data/answers.jsonl` through the
production `AnswerPipeline` (no LLM: the extractive answerer), on the web channel, with the
page the visitor is on as the widget sends it (address, title, text, `<html lang>`), after the
question's preceding turns in the same conversation.

The agent's answer threshold is set to 0, so the bot attempts every answer and reports its
`confidence`; the deployed behaviour is what the pipeline does with the default threshold
(`ANSWER_THRESHOLD`): below it, the attempt is replaced by the deferral. Printed:

- as deployed: the share of answerable questions whose reply contains every fact (per kind
  and language), and the share of unanswerable ones deferred;
- the attempts: a reliability table (confidence bins, mean confidence against the observed
  share right) and the AUC with which confidence separates right attempts from wrong ones.
  An attempt is right when it holds the facts of an answerable question; every attempt at an
  unanswerable one is wrong.

`--fit` refits the weights of `core/answer/confidence.py` on these attempts (logistic
regression on the recorded signals, with 5-fold cross-validated AUC) and prints them.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import unicodedata
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import numpy as np

from bench.answer_figures import Attempt, auc, print_calibration, print_outcomes
from bench.database import bench_settings
from bench.model import evaluated_model
from core.answer.confidence import WEIGHTS
from core.answer.factory import build_pipeline
from core.answer.pipeline import ANSWER_THRESHOLD, AnswerPipeline, PipelineConfig, TurnOutcome
from core.cache import LocalCache
from core.knowledge.extract import extract_page
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database, open_database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from core.turns import CollectingTurnOutput, PageContext, TurnRequest

DATA = Path(__file__).parent / "data"
SHOP = DATA / "shop"
AGENT = "shop"
CONTACT_ROUTE = "info@noordkaap.example or +31 10 555 0142"


@dataclass(frozen=True)
class Turn:
    question: str
    page: str | None


@dataclass(frozen=True)
class Case:
    qid: str
    lang: str
    kind: str
    question: str
    page: str | None
    history: tuple[Turn, ...]
    facts: tuple[tuple[str, ...], ...]
    answerable: bool


@dataclass(frozen=True)
class Reply:
    case: Case
    answer: str
    confidence: float
    low_confidence: bool
    deferred: bool
    rewritten: str | None
    signals: dict[str, float]

    @property
    def contains_facts(self) -> bool:
        text = _normal(self.answer)
        return all(any(_normal(alt) in text for alt in group) for group in self.case.facts)

    @property
    def right(self) -> bool:
        """Right as a reply: the facts when the shop says them, a deferral when it does not."""
        if self.case.answerable:
            return not self.deferred and self.contains_facts
        return self.deferred

    @property
    def attempt_right(self) -> bool:
        """Right as an attempt (threshold 0): only an answerable question can be answered."""
        return self.case.answerable and self.contains_facts


def _normal(text: str) -> str:
    text = unicodedata.normalize("NFKC", text).casefold()
    text = text.replace("\u2011", "-").replace("\u2013", "-")
    return " ".join(text.split())


def load_cases(path: Path) -> list[Case]:
    cases = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip():
            continue
        row = json.loads(line)
        cases.append(
            Case(
                qid=row["qid"],
                lang=row["lang"],
                kind=row["kind"],
                question=row["question"],
                page=row.get("page"),
                history=tuple(Turn(t["question"], t.get("page")) for t in row.get("history", [])),
                facts=tuple(tuple(group) for group in row.get("facts", [])),
                answerable=bool(row.get("answerable", True)),
            )
        )
    return cases


_PAGES: dict[str, PageContext] = {}
_LANGUAGES: dict[str, str] = {}


def page_context(path: str | None) -> PageContext | None:
    """The page as the widget describes it: address, title and its main text."""
    if path is None:
        return None
    if path not in _PAGES:
        file = SHOP / path.lstrip("/")
        doc = extract_page(file.read_bytes(), path)
        text = re.sub(r"^#+\s*", "", doc.text, flags=re.MULTILINE)
        _PAGES[path] = PageContext(url=path, title=doc.title, context=text[:4000])
        if doc.locale:
            _LANGUAGES[path] = doc.locale
    return _PAGES[path]


async def ask(
    pipeline: AnswerPipeline, key: str, text: str, page: str | None
) -> tuple[CollectingTurnOutput, TurnOutcome]:
    output = CollectingTurnOutput()
    context = page_context(page)
    request = TurnRequest(
        agent=AGENT,
        channel="web",
        conversation_key=key,
        text=text,
        page=context,
        language=_LANGUAGES.get(page or ""),  # the widget sends the page's <html lang>
    )
    outcome = await pipeline.run(request, output)
    return output, outcome


async def run_case(
    pipeline: AnswerPipeline, pool: asyncpg.Pool, case: Case, session: str = ""
) -> Reply:
    """``case`` asked after its earlier turns, in a conversation of its own (``session``
    tells apart conversations of several runs on one database)."""
    key = f"{session}{case.qid}"
    for turn in case.history:
        await ask(pipeline, key, turn.question, turn.page)
    output, outcome = await ask(pipeline, key, case.question, case.page)
    done = output.done or {}
    if output.error:
        raise RuntimeError(f"{case.qid}: {output.error}")
    trace = await pool.fetchval("SELECT trace FROM turns WHERE id = $1", outcome.turn_id)
    if isinstance(trace, str):
        trace = json.loads(trace)
    return Reply(
        case=case,
        answer=str(done.get("answer", "")),
        confidence=float(done.get("confidence") or 0.0),
        low_confidence=bool(done.get("low_confidence")),
        deferred=bool(done.get("deferred")),
        rewritten=outcome.searched,
        signals=trace.get("confidence_signals", {}),
    )


def as_deployed(reply: Reply, threshold: float) -> Reply:
    """The reply the default threshold gives: the attempt, or the deferral below it."""
    if reply.deferred or reply.confidence >= threshold:
        return reply
    return replace(reply, answer="", deferred=True, low_confidence=True)


async def open_shop(settings: Settings) -> tuple[Database, UseEmbedder, Agents]:
    """The bundled shop's agent, its pages ingested, on a database of its own."""
    database = await open_database(settings, max_size=4)
    embedder = UseEmbedder()
    agents = Agents(database.pool)
    agent = await agents.create(
        AGENT, embedder=EmbedderIdentity.of(embedder), language="en", timezone="Europe/Amsterdam"
    )
    await agents.update(AGENT, contact_route=CONTACT_ROUTE)
    report = await Ingestor(KnowledgeStore(database.pool), embedder).ingest(
        agent, parse_source(str(SHOP))
    )
    print(f"ingested {report.added} pages ({report.chunks_embedded} chunks)")
    return database, embedder, agents


async def evaluate(settings: Settings, cases: Sequence[Case]) -> list[Reply]:
    database, embedder, agents = await open_shop(settings)
    await agents.update(AGENT, settings={"answer_threshold": 0.0})
    async with aiohttp.ClientSession() as session, evaluated_model(settings) as chat:
        pipeline = build_pipeline(
            settings,
            database.pool,
            LocalCache(),
            embedder,
            session,
            chat=chat,
            config=PipelineConfig(pace_seconds=0.0),
        )
        replies = [await run_case(pipeline, database.pool, case) for case in cases]
        await pipeline.memory.drain()  # summaries and topics still being written
    await database.close()
    return replies


def _share(flags: Sequence[bool]) -> str:
    return f"{sum(flags) / len(flags):5.2f}" if flags else "    -"


def print_answers(replies: Sequence[Reply]) -> None:
    print("Replies as deployed: share of answerable questions whose reply holds the fact;")
    print("share of unanswerable questions deferred.\n")
    kinds = sorted({r.case.kind for r in replies if r.case.answerable})
    languages = sorted({r.case.lang for r in replies})
    header = f"{'kind':<14}" + "".join(f"{lang:>12}" for lang in [*languages, "all"])
    print(header)
    for kind in [*kinds, "answerable"]:
        cells = []
        for lang in [*languages, "all"]:
            rows = [
                r
                for r in replies
                if r.case.answerable
                and (kind == "answerable" or r.case.kind == kind)
                and (lang == "all" or r.case.lang == lang)
            ]
            cells.append(f"{_share([r.right for r in rows])} ({len(rows):>3})")
        print(f"{kind:<14}" + "".join(f"{c:>12}" for c in cells))
    cells = []
    for lang in [*languages, "all"]:
        rows = [r for r in replies if not r.case.answerable and lang in ("all", r.case.lang)]
        cells.append(f"{_share([r.deferred for r in rows])} ({len(rows):>3})")
    print(f"{'deferred':<14}" + "".join(f"{c:>12}" for c in cells))
    answerable = [r for r in replies if r.case.answerable]
    wrongly = [r for r in answerable if r.deferred]
    flagged = [r for r in answerable if not r.deferred and r.low_confidence]
    print(
        f"\nanswerable deferred: {len(wrongly)}/{len(answerable)}; "
        f"answered but flagged low_confidence: {len(flagged)} "
        f"(of them right: {sum(r.contains_facts for r in flagged)})"
    )


def print_wrong(attempts: Sequence[Reply]) -> None:
    print("\nWrong attempts (threshold 0):")
    for r in attempts:
        if r.attempt_right or (not r.case.answerable and r.confidence < ANSWER_THRESHOLD):
            continue  # (an unanswerable question's attempt counts when it would be sent)
        facts = " & ".join("|".join(g) for g in r.case.facts) or "(defer)"
        print(f"\n[{r.case.qid} {r.case.kind}] {r.case.question}  page={r.case.page}")
        for turn in r.case.history:
            print(f"    after: {turn.question}  page={turn.page}")
        print(f"    want: {facts}   conf={r.confidence:.2f} low={r.low_confidence}")
        if r.rewritten:
            print(f"    searched: {r.rewritten}")
        print(f"    got:  {r.answer}")


def fit(attempts: Sequence[Reply]) -> None:
    """Logistic regression of being right on the recorded signals (numpy, L2-regularised)."""
    names = [n for n in WEIGHTS if n != "bias"]
    x = np.array([[r.signals.get(n, 0.0) for n in names] for r in attempts], dtype=np.float64)
    y = np.array([r.attempt_right for r in attempts], dtype=np.float64)

    def train(x: np.ndarray, y: np.ndarray) -> np.ndarray:
        design = np.hstack([np.ones((len(x), 1)), x])
        w = np.zeros(design.shape[1])
        for _ in range(5000):
            p = 1 / (1 + np.exp(-design @ w))
            grad = design.T @ (p - y) / len(y) + 0.01 * np.r_[0, w[1:]]
            w -= 0.5 * grad
        return w

    folds = np.arange(len(y)) % 5
    held_out = np.zeros(len(y))
    for k in range(5):
        w = train(x[folds != k], y[folds != k])
        held_out[folds == k] = 1 / (1 + np.exp(-(w[0] + x[folds == k] @ w[1:])))
    w = train(x, y)
    print("\nFitted weights (paste into core/answer/confidence.py):")
    print("    " + ", ".join(f'"{n}": {v:.3f}' for n, v in zip(["bias", *names], w, strict=True)))
    print(f"5-fold cross-validated AUC {auc(list(held_out), [bool(v) for v in y]):.3f}")


async def main(args: argparse.Namespace) -> None:
    cases = load_cases(Path(args.questions))
    if args.only:
        cases = [c for c in cases if re.search(args.only, f"{c.qid} {c.kind}")]
    async with bench_settings() as settings:
        attempts = await evaluate(settings, cases)
    deployed = [as_deployed(r, ANSWER_THRESHOLD) for r in attempts]
    print()
    print_answers(deployed)
    print_calibration([as_attempt(r) for r in attempts])
    print()
    print_outcomes([as_attempt(r) for r in attempts], ANSWER_THRESHOLD, "The shop")
    if args.fit:
        fit(attempts)
    if args.show == "wrong":
        print_wrong(attempts)
    if args.json:
        Path(args.json).write_text(
            "".join(json.dumps(as_attempt(r).__dict__, ensure_ascii=False) + "\n" for r in attempts)
        )


def as_attempt(reply: Reply) -> Attempt:
    """The reply in the figures every evaluation shares (`bench.answer_figures`)."""
    case = reply.case
    facts = " & ".join("|".join(g) for g in case.facts) or "(defer)"
    history = "".join(f"    after: {t.question}\n" for t in case.history)
    return Attempt(
        qid=case.qid, lang=case.lang, kind=case.kind if case.answerable else "unanswerable",
        answerable=case.answerable, answered=not reply.deferred,
        right=case.answerable and not reply.deferred and reply.contains_facts,
        confidence=reply.confidence, signals=reply.signals, answer=reply.answer, corpus="shop",
        detail=f"{history}    asked: {case.question}  page={case.page}\n    want: {facts}",
    )  # fmt: skip


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", default=str(DATA / "answers.jsonl"))
    parser.add_argument("--show", choices=["wrong", "none"], default="none")
    parser.add_argument("--only", help="regular expression on 'qid kind'")
    parser.add_argument("--json", help="write one line per question to this file")
    parser.add_argument("--fit", action="store_true", help="refit the confidence weights")
    return parser


def _main_args() -> Any:
    return _parser().parse_args()


if __name__ == "__main__":
    asyncio.run(main(_main_args()))
