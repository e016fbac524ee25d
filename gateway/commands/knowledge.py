"""`parley ingest`, `parley source list|remove` and `parley rebuild-index`."""

from __future__ import annotations

import argparse
import sys

from tqdm import tqdm  # type: ignore[import-untyped]

from core.errors import InvalidInput
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import EmbedderIdentity
from core.store import Agents
from core.store.knowledge import KnowledgeStore, reembed_agent
from gateway.runtime import Runtime


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ingest = commands.add_parser(
        "ingest", help="add or refresh content: a folder, a .jsonl file, a URL or a sitemap"
    )
    ingest.add_argument("--agent", required=True, metavar="A")
    ingest.add_argument("sources", nargs="+", metavar="PATH_OR_URL")
    ingest.add_argument(
        "--base-url",
        help="public URL of a folder's files (default: their path, e.g. /en/shipping.html)",
    )
    source = commands.add_parser("source", help="list or remove an agent's sources")
    actions = source.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="sources with status, pages and last error")
    listing.add_argument("--agent", required=True, metavar="A")
    remove = actions.add_parser("remove", help="remove a source and its pages")
    remove.add_argument("--agent", required=True, metavar="A")
    remove.add_argument("id", type=int, metavar="ID")
    rebuild = commands.add_parser(
        "rebuild-index", help="re-embed an agent's content with the configured embedder"
    )
    rebuild.add_argument("--agent", required=True, metavar="A")


def _bar(total: int | None, unit: str) -> tqdm:
    return tqdm(
        total=total, unit=unit, file=sys.stderr, disable=not sys.stderr.isatty(), leave=False
    )


async def ingest(args: argparse.Namespace, runtime: Runtime) -> int:
    """Ingest each source; unreadable parts are listed, the rest is indexed. Exit 1 on errors."""
    _check_base_url(args.base_url)
    specs = [parse_source(s) for s in args.sources]
    agent = await Agents(runtime.database.pool).get(args.agent)
    ingestor = Ingestor(
        KnowledgeStore(runtime.database.pool),
        runtime.embedder,
        allow_networks=runtime.settings.crawl_allow_networks,
    )
    status = 0
    for spec in specs:
        with _bar(None, "page") as bar:
            report = await ingestor.ingest(
                agent, spec, base_url=args.base_url, on_page=lambda: bar.update()
            )
        for error in report.errors:
            print(f"{error.location}: {error.reason}", file=sys.stderr)
        if report.failed:
            print(f"parley: error: {spec.location}: {report.failed}", file=sys.stderr)
            status = 2
            continue
        if report.errors:
            status = max(status, 1)
        print(
            f"{spec.location}: {report.added} added, {report.updated} updated, "
            f"{report.unchanged} unchanged, {report.removed} removed, "
            f"{len(report.errors)} unreadable ({report.chunks_embedded} chunks embedded)"
        )
        agent = await Agents(runtime.database.pool).get(args.agent)
    return status


async def sources(args: argparse.Namespace, runtime: Runtime) -> int:
    agent = await Agents(runtime.database.pool).get(args.agent)
    store = KnowledgeStore(runtime.database.pool)
    if args.action == "remove":
        removed = await store.remove_source(agent.id, args.id)
        print(f"removed source {args.id} and its {removed} pages")
        return 0
    for source in await store.list_sources(agent.id):
        crawled = (
            source.last_crawled_at.isoformat(timespec="seconds") if source.last_crawled_at else "-"
        )
        error = f"\t{source.last_error}" if source.last_error else ""
        print(
            f"{source.id}\t{source.kind}\t{source.status}\t{source.pages} pages\t{crawled}\t"
            f"{source.location}{error}"
        )
    return 0


async def rebuild_index(args: argparse.Namespace, runtime: Runtime) -> int:
    agent = await Agents(runtime.database.pool).get(args.agent)
    identity = EmbedderIdentity.of(runtime.embedder)
    total = await KnowledgeStore(runtime.database.pool).count_chunks(agent.id)
    with _bar(total, "chunk") as bar:
        done = await reembed_agent(
            runtime.database.pool, agent.id, identity, runtime.embedder.embed, on_batch=bar.update
        )
    print(
        f"re-embedded {done} chunks of {agent.slug} with {identity.name} "
        f"({identity.dimension} dimensions)"
    )
    return 0


def _check_base_url(value: str | None) -> None:
    if value is not None and not value.startswith(("http://", "https://", "/")):
        raise InvalidInput("--base-url must be an http(s) URL or a path starting with /")
