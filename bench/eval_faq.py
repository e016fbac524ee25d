"""Answer quality on support content nobody here wrote: the Corona-Warn-App FAQ (English and
German, `bench/data/cwa-faq/`, Apache-2.0), without a model.

    .venv/bin/python -m bench.eval_faq                 # every question
    .venv/bin/python -m bench.eval_faq --only 'de-r-'  # some questions only
    .venv/bin/python -m bench.eval_faq --show wrong    # print every confidently wrong reply

Each FAQ entry is one page (its question as title and heading, its answer as text), as a help
centre publishes them. Agents:

- ``both`` (German and English pages, German first), ``en`` and ``de`` (one language each)
  hold every entry: the answerable questions are asked there;
- ``both-part``, ``en-part`` and ``de-part`` hold two thirds of the entries (the same third is
  left out of each, chosen by a hash of the entry's id): the questions of the left-out
  entries are asked there, and must be deferred.

Kinds of question (`bench/data/cwa-faq/questions.jsonl` holds the written ones):

- ``own``: the entry's own question, word for word, in its language;
- ``reworded``: as visitors type them (short, informal, misspelt, without the FAQ's words);
- ``cross``: a question in another language than the agent's content (German on ``en``,
  English on ``de``, French and Spanish on all three);
- ``follow-up``: asked after an earlier question in the same conversation;
- ``unanswerable``: own and reworded questions of the left-out entries, on the ``-part`` agents.

A reply is right when it is not deferred and its first citation is the answering entry (or one
its question lists as answering equally well); see `bench/answer_figures.py` for the figures.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import re
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

from bench.answer_figures import Attempt, print_calibration, print_outcomes, print_wrong
from bench.database import bench_settings
from bench.model import evaluated_model
from core.answer.factory import build_pipeline
from core.answer.pipeline import ANSWER_THRESHOLD, AnswerPipeline, PipelineConfig
from core.cache import LocalCache
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database, open_database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity
from core.turns import CollectingTurnOutput, TurnRequest

FAQ = Path(__file__).parent / "data" / "cwa-faq"
SITE = "https://www.coronawarn.app"
CONTACT_ROUTE = "the Corona-Warn-App hotline, 0800 7540001"
# Entries whose answer is a build placeholder, and anchors the two languages use for
# different questions (see the data's README).
_SKIPPED = re.compile(r"^(update_faq|check_in_luca_.*)$")
AGENTS = {  # slug -> (languages held, default language, all entries or two thirds)
    "both": (("de", "en"), "de", False),
    "en": (("en",), "en", False),
    "de": (("de",), "de", False),
    "both-part": (("de", "en"), "de", True),
    "en-part": (("en",), "en", True),
    "de-part": (("de",), "de", True),
}
# The agents a question in a language is asked on, by kind: its language's own content, or
# content in another language.
_OWN = {"en": ("en", "both"), "de": ("de", "both")}
_CROSS = {"en": ("de",), "de": ("en",), "fr": ("both", "en", "de"), "es": ("both", "en", "de")}


@dataclass(frozen=True)
class Entry:
    id: str
    lang: str
    question: str
    answer: str

    @property
    def url(self) -> str:
        return f"{SITE}/{self.lang}/faq/{self.id}"


@dataclass(frozen=True)
class FaqCase:
    qid: str
    lang: str
    kind: str
    question: str
    agent: str
    answers: frozenset[str]  # the entries that answer it (empty: unanswerable there)
    history: tuple[str, ...] = ()


def left_out(entry_id: str) -> bool:
    """The third of the entries the ``-part`` agents do not hold."""
    return int(hashlib.sha256(entry_id.encode()).hexdigest(), 16) % 3 == 0


def load_entries() -> list[Entry]:
    rows = [json.loads(line) for line in (FAQ / "faq.jsonl").read_text("utf-8").splitlines()]
    return [
        Entry(r["id"], r["lang"], r["question"], r["answer"])
        for r in rows
        if not _SKIPPED.match(r["id"]) and "[" not in r["answer"][:1]
    ]


def build_cases(entries: Sequence[Entry], written: Sequence[dict[str, Any]]) -> list[FaqCase]:
    ids = {e.id for e in entries}
    cases: list[FaqCase] = []

    def add(qid: str, lang: str, kind: str, text: str, agents: Sequence[str],
            answers: set[str], history: tuple[str, ...] = ()) -> None:  # fmt: skip
        for agent in agents:
            part = AGENTS[agent][2]
            held = {a for a in answers if a in ids and not (part and left_out(a))}
            if part and held:
                continue  # the -part agents are asked only what they cannot answer
            if not part and not held:
                continue  # (an entry skipped as a placeholder)
            shown = "unanswerable" if part else kind
            cases.append(
                FaqCase(f"{qid}@{agent}", lang, shown, text, agent, frozenset(held), history)
            )

    for entry in entries:
        full = _OWN[entry.lang]
        add(f"{entry.lang}-own-{entry.id}", entry.lang, "own", entry.question, full, {entry.id})
        if left_out(entry.id):
            parts = [f"{a}-part" for a in full]
            add(
                f"{entry.lang}-own-{entry.id}", entry.lang, "own", entry.question, parts, {entry.id}
            )
    for row in written:
        answers = {row["entry"], *row.get("also", [])}
        lang, kind = row["lang"], row["kind"]
        history = tuple(turn["question"] for turn in row.get("history", []))
        if lang in _OWN:
            add(row["qid"], lang, kind, row["question"], _OWN[lang], answers, history)
        if kind == "follow-up":
            continue
        add(row["qid"], lang, "cross", row["question"], _CROSS[lang], answers)
        if all(left_out(a) for a in answers):
            agents = [f"{a}-part" for a in (_OWN.get(lang) or ("both",))]
            add(row["qid"], lang, kind, row["question"], agents, answers)
    return cases


async def open_agents(
    settings: Settings, entries: Sequence[Entry]
) -> tuple[Database, UseEmbedder, dict[str, dict[str, str]]]:
    """The six agents, their pages ingested; per agent, its pages' URL -> entry id."""
    database = await open_database(settings, max_size=4)
    embedder = UseEmbedder()
    agents = Agents(database.pool)
    store = KnowledgeStore(database.pool)
    urls: dict[str, dict[str, str]] = {}
    with tempfile.TemporaryDirectory(prefix="parley-faq-") as tmp:
        for slug, (languages, default, part) in AGENTS.items():
            held = [e for e in entries if e.lang in languages and not (part and left_out(e.id))]
            path = Path(tmp) / f"{slug}.jsonl"
            pages = [
                {"url": e.url, "title": e.question, "lang": e.lang,
                 "text": f"# {e.question}\n\n{e.answer}"}
                for e in held
            ]  # fmt: skip
            lines = [json.dumps(page, ensure_ascii=False) for page in pages]
            path.write_text("\n".join(lines), encoding="utf-8")
            agent = await agents.create(
                f"faq-{slug}", embedder=EmbedderIdentity.of(embedder), language=default,
                timezone="Europe/Berlin",
            )  # fmt: skip
            await agents.update(
                agent.slug, contact_route=CONTACT_ROUTE, settings={"answer_threshold": 0.0}
            )
            await Ingestor(store, embedder).ingest(agent, parse_source(str(path)))
            urls[slug] = {e.url: e.id for e in held}
    print(f"ingested {len(entries)} entries into {len(AGENTS)} agents")
    return database, embedder, urls


async def _ask(pipeline: AnswerPipeline, agent: str, key: str, text: str) -> Any:
    output = CollectingTurnOutput()
    request = TurnRequest(agent=f"faq-{agent}", channel="web", conversation_key=key, text=text)
    outcome = await pipeline.run(request, output)
    if output.error:
        raise RuntimeError(f"{key}: {output.error}")
    return output, outcome


async def run_case(
    pipeline: AnswerPipeline, database: Database, urls: dict[str, dict[str, str]], case: FaqCase
) -> Attempt:
    for earlier in case.history:
        await _ask(pipeline, case.agent, case.qid, earlier)
    output, outcome = await _ask(pipeline, case.agent, case.qid, case.question)
    done = output.done or {}
    trace = await database.pool.fetchval("SELECT trace FROM turns WHERE id = $1", outcome.turn_id)
    trace = json.loads(trace) if isinstance(trace, str) else trace or {}
    cited = [urls[case.agent].get(s.url, s.url) for s in outcome.sources]
    answered = not bool(done.get("deferred"))
    right = answered and bool(cited) and cited[0] in case.answers
    # The pages in the order retrieval ranked them (the sources are renumbered as cited).
    ranked = [str(h["url"]) for h in trace.get("retrieved", [])]
    offered = [urls[case.agent].get(url, "") for url in dict.fromkeys(ranked)]
    found = next((i for i, e in enumerate(offered, start=1) if e in case.answers), 0)
    detail = "".join(f"    after: {h}\n" for h in case.history)
    detail += (
        f"    asked: {case.question}\n    want: {', '.join(sorted(case.answers)) or '(defer)'}"
    )
    detail += f"   cited: {', '.join(cited) or '-'}   among the sources at: {found or '-'}"
    return Attempt(
        qid=case.qid, lang=case.lang, kind=case.kind, answerable=bool(case.answers),
        answered=answered, right=right, confidence=float(done.get("confidence") or 0.0),
        signals={**trace.get("confidence_signals", {}), "source_rank": float(found)},
        answer=str(done.get("answer", "")),
        corpus="faq", detail=detail,
    )  # fmt: skip


async def evaluate(settings: Settings, only: str | None = None) -> list[Attempt]:
    entries = load_entries()
    written_path = FAQ / "questions.jsonl"
    lines = written_path.read_text("utf-8").splitlines() if written_path.exists() else []
    written = [json.loads(line) for line in lines if line.strip()]
    cases = build_cases(entries, written)
    if only:
        cases = [c for c in cases if re.search(only, f"{c.qid} {c.kind}")]
    database, embedder, urls = await open_agents(settings, entries)
    async with aiohttp.ClientSession() as session, evaluated_model(settings) as chat:
        pipeline = build_pipeline(
            settings, database.pool, LocalCache(), embedder, session, chat=chat,
            config=PipelineConfig(pace_seconds=0.0),
        )  # fmt: skip
        attempts = [await run_case(pipeline, database, urls, case) for case in cases]
        await pipeline.memory.drain()
    await database.close()
    return attempts


def report(attempts: Sequence[Attempt], threshold: float = ANSWER_THRESHOLD) -> None:
    print_outcomes(attempts, threshold, "Corona-Warn-App FAQ, every agent")
    print("\nthe answering entry among the pages retrieval ranked (share of answerable):")
    for kind in sorted({a.kind for a in attempts if a.answerable}):
        rows = [a for a in attempts if a.answerable and a.kind == kind]
        first = sum(a.signals.get("source_rank") == 1 for a in rows) / len(rows)
        read = sum(bool(a.signals.get("source_rank")) for a in rows) / len(rows)
        print(f"  {kind:<12} first {first:.2f}   top ten chunks {read:.2f}   (n={len(rows)})")
    for agents, name in ((("both",), "bilingual agent"), (("en", "de"), "one-language agents")):
        rows = [a for a in attempts if a.qid.rsplit("@", 1)[1].removesuffix("-part") in agents]
        print()
        print_outcomes(rows, threshold, f"Corona-Warn-App FAQ, {name}")


async def main(args: argparse.Namespace) -> None:
    async with bench_settings() as settings:
        attempts = await evaluate(settings, args.only)
    print()
    report(attempts)
    print_calibration(attempts)
    if args.show == "wrong":
        print_wrong(attempts, ANSWER_THRESHOLD)
    if args.json:
        Path(args.json).write_text(
            "".join(json.dumps(a.__dict__, ensure_ascii=False) + "\n" for a in attempts)
        )


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--show", choices=["wrong", "none"], default="none")
    parser.add_argument("--only", help="regular expression on 'qid kind'")
    parser.add_argument("--json", help="write one line per attempt to this file")
    return parser


if __name__ == "__main__":
    asyncio.run(main(_parser().parse_args()))
