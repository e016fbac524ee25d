"""Retrieval quality on the bundled multilingual shop: hit@1, hit@5, MRR@10 per language pair.

    .venv/bin/python -m bench.eval_retrieval            # embedded PostgreSQL in a temp dir
    .venv/bin/python -m bench.eval_retrieval --by kind  # rows per question kind instead
    .venv/bin/python -m bench.eval_retrieval --by lang-kind  # per question language and kind

Ingests `bench/data/shop/` (English, Dutch and German pages plus English-only pages without a
language folder) and asks every question of `bench/data/questions.jsonl` in its own language,
as the widget would, through four retrievers: full-text only, dense only, hybrid with plain
reciprocal rank fusion, and the final hybrid (calibrated fusion, boosts, language folders).
"""

from __future__ import annotations

import argparse
import asyncio
import json
from collections import defaultdict
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.database import bench_settings
from core.cache import LocalCache
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.locale import language_of, locale_from_url
from core.retrieval.embedders import UseEmbedder
from core.retrieval.retriever import RetrievalQuery, Retriever
from core.settings import Settings
from core.store import Agents, open_database
from core.store.knowledge import KnowledgeStore
from core.store.search import ChunkSearch
from core.store.vector_index import EmbedderIdentity

DATA = Path(__file__).parent / "data"
RETRIEVERS: dict[str, dict[str, Any]] = {
    "lexical": {"mode": "lexical"},
    "dense": {"mode": "dense"},
    "hybrid-rrf": {"mode": "hybrid", "fusion": "rrf"},
    "final": {"mode": "hybrid", "fusion": "calibrated"},
}


@dataclass(frozen=True)
class Question:
    qid: str
    text: str
    lang: str
    expected: frozenset[str]
    kind: str

    @property
    def pair(self) -> str:
        folder = locale_from_url(next(iter(sorted(self.expected))))
        return f"{self.lang}->{language_of(folder) if folder else 'en'}"

    def group(self, by: str) -> str:
        if by == "pair":
            return self.pair
        if by == "lang-kind":
            return f"{self.lang} {self.kind}"
        return self.kind


def load_questions(path: Path) -> list[Question]:
    rows = [
        json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()
    ]
    return [
        Question(
            r["qid"], r["question"], r["lang"], frozenset(r["expected"]), r.get("kind", "same")
        )
        for r in rows
    ]


def score(ranked_urls: list[str], expected: frozenset[str]) -> tuple[float, float, float]:
    """hit@1, hit@5, reciprocal rank within 10."""
    for rank, url in enumerate(ranked_urls[:10], start=1):
        if url in expected:
            return float(rank == 1), float(rank <= 5), 1.0 / rank
    return 0.0, 0.0, 0.0


async def evaluate(
    url: str, questions: list[Question], by: str
) -> dict[str, dict[str, list[tuple[float, float, float]]]]:
    settings = Settings(_env_file=None, database_url=url)  # type: ignore[call-arg]
    database = await open_database(settings, max_size=4)
    embedder = UseEmbedder()
    agent = await Agents(database.pool).create(
        "shop", embedder=EmbedderIdentity.of(embedder), language="en", timezone="Europe/Amsterdam"
    )
    report = await Ingestor(KnowledgeStore(database.pool), embedder).ingest(
        agent, parse_source(str(DATA / "shop"))
    )
    print(
        f"ingested {report.added} pages ({report.chunks_embedded} chunks), "
        f"{len(report.errors)} unreadable"
    )
    agent = await Agents(database.pool).get("shop")
    retriever = Retriever(ChunkSearch(database.pool), embedder, LocalCache())
    vectors = await retriever.embed_queries([q.text for q in questions])
    results: dict[str, dict[str, list[tuple[float, float, float]]]] = {
        name: defaultdict(list) for name in RETRIEVERS
    }
    for question, vector in zip(questions, vectors, strict=True):
        group = question.group(by)
        for name, options in RETRIEVERS.items():
            result = await retriever.retrieve(
                RetrievalQuery(
                    agent=agent, text=question.text, k=30, reply_language=question.lang, **options
                ),
                vector,
            )
            urls = [hit.url for hit in result.pages(ranked=True)]
            metrics = score(urls, question.expected)
            results[name][group].append(metrics)
            results[name]["all"].append(metrics)
    await database.close()
    return results


def print_table(results: dict[str, dict[str, list[tuple[float, float, float]]]], by: str) -> None:
    groups = [*sorted({g for per in results.values() for g in per if g != "all"}), "all"]
    width = max(10, *(len(g) for g in groups))
    header = f"{by:<{width}} {'n':>4}  " + "  ".join(f"{name:^20}" for name in RETRIEVERS)
    print(header)
    print(f"{'':<{width}} {'':>4}  " + "  ".join(f"{'hit@1  hit@5  MRR':^20}" for _ in RETRIEVERS))
    for group in groups:
        cells = []
        for name in RETRIEVERS:
            rows = results[name][group]
            n = len(rows)
            h1 = sum(r[0] for r in rows) / n
            h5 = sum(r[1] for r in rows) / n
            mrr = sum(r[2] for r in rows) / n
            cells.append(f"{h1:5.2f}  {h5:5.2f}  {mrr:5.2f}")
        n = len(results["final"][group])
        print(f"{group:<{width}} {n:>4}  " + "  ".join(f"{c:^20}" for c in cells))


async def main(args: argparse.Namespace) -> None:
    questions = load_questions(DATA / "questions.jsonl")
    async with bench_settings() as settings:
        assert settings.database_url is not None
        results = await evaluate(settings.database_url.get_secret_value(), questions, args.by)
    print()
    print_table(results, args.by)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--by", choices=["pair", "kind", "lang-kind"], default="pair")
    asyncio.run(main(parser.parse_args()))
