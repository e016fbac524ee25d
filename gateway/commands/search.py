"""`parley search`: what retrieval returns for a question, or for a file of questions."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from core.errors import InvalidInput
from core.retrieval.retriever import RetrievalQuery, RetrievalResult, build_retriever
from core.store import Agents
from gateway.runtime import Runtime


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    search = commands.add_parser("search", help="search an agent's content")
    search.add_argument("--agent", required=True, metavar="A")
    search.add_argument("query", nargs="?", help="the question")
    search.add_argument("--k", type=int, default=10, help="results to return (default 10)")
    search.add_argument("--json", action="store_true", help="print JSON")
    search.add_argument(
        "--batch",
        type=Path,
        metavar="FILE",
        help='JSONL of {"qid", "question", "lang"?}; prints {"qid", "results"} lines',
    )
    search.add_argument("--lang", help="reply language (default: detected from the question)")
    search.add_argument("--page", help="URL of the page the visitor is on")
    search.add_argument("--tag", action="append", default=[], help="only pages with this tag")
    search.add_argument("--exclude-tag", action="append", default=[], help="skip this tag")
    search.add_argument(
        "--internal", action="store_true", help="include internal pages (staff view)"
    )


def _query(
    args: argparse.Namespace, agent: Any, text: str, lang: str | None, k: int
) -> RetrievalQuery:
    return RetrievalQuery(
        agent=agent,
        text=text,
        k=k,
        page_url=args.page,
        reply_language=lang,
        visibility=("public", "internal") if args.internal else ("public",),
        include_tags=tuple(args.tag),
        exclude_tags=tuple(args.exclude_tag),
    )


def _pages(result: RetrievalResult, k: int) -> list[dict[str, Any]]:
    """Ranked pages, whether or not they pass the agent's threshold: ranking is what a
    batch run evaluates; `low_confidence` is decided separately."""
    return [{"url": h.url, "score": h.score} for h in result.pages(ranked=True)[:k]]


def _read_batch(path: Path) -> list[dict[str, Any]]:
    rows = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError as exc:
        raise InvalidInput(f"{path}: {exc.strerror}") from None
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
            if not isinstance(row.get("question"), str) or "qid" not in row:
                raise ValueError("needs qid and question")
        except (ValueError, AttributeError) as exc:
            raise InvalidInput(f"{path}:{number}: {exc}") from None
        rows.append(row)
    return rows


async def run(args: argparse.Namespace, runtime: Runtime) -> int:
    if (args.batch is None) == (args.query is None):
        raise InvalidInput("give either a query or --batch FILE")
    if args.k < 1 or args.k > 100:
        raise InvalidInput("--k must be between 1 and 100")
    agent = await Agents(runtime.database.pool).get(args.agent)
    retriever = build_retriever(
        runtime.settings, runtime.database.pool, runtime.embedder, runtime.cache, runtime.http
    )
    if args.batch is not None:
        rows = _read_batch(args.batch)
        vectors = await retriever.embed_queries([r["question"] for r in rows])
        for row, vector in zip(rows, vectors, strict=True):
            # Several chunks may come from one page: ask for more, list pages.
            query = _query(args, agent, row["question"], row.get("lang") or args.lang, 3 * args.k)
            result = await retriever.retrieve(query, vector)
            print(json.dumps({"qid": row["qid"], "results": _pages(result, args.k)}))
        return 0
    result = await retriever.retrieve(_query(args, agent, args.query, args.lang, args.k))
    passed = set(result.hits)
    if args.json:
        print(
            json.dumps(
                {
                    "query": args.query,
                    "language": result.query_language,
                    "confidence": result.confidence,
                    "low_confidence": result.low_confidence,
                    "threshold": agent.confidence_threshold,
                    "results": [
                        {
                            "url": h.url,
                            "title": h.title,
                            "heading": h.heading,
                            "score": h.score,
                            "match": h.match,
                            "passed": h in passed,
                            "text": h.text,
                        }
                        for h in result.ranked
                    ],
                },
                ensure_ascii=False,
            )
        )
        return 0
    if not result.ranked:
        print("nothing found", file=sys.stderr)
    for rank, hit in enumerate(result.ranked, start=1):
        snippet = " ".join(hit.text.split())[:160]
        below = "" if hit in passed else "  (below threshold)"
        print(f"{rank:2}. {hit.score:.3f}  {hit.url}  [{hit.heading}]{below}\n    {snippet}")
    if result.low_confidence:
        print("(low confidence)", file=sys.stderr)
    return 0
