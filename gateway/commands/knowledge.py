"""`parley ingest`, `parley source list|remove` and `parley rebuild-index`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TextIO

import numpy as np
from numpy.typing import NDArray
from tqdm import tqdm  # type: ignore[import-untyped]

from core.documents import Chunk
from core.errors import InvalidInput
from core.knowledge.chunk import embed_chunks
from core.knowledge.ingest import Ingestor, IngestProgress, IngestReport, fill_piece_vectors
from core.knowledge.sources import SourceSpec, parse_source
from core.store import Agents
from core.store.knowledge import KnowledgeStore, SourceRecord, reembed_agent
from core.store.piece_vectors import PieceVectors
from core.store.vector_index import EmbedderIdentity
from core.tags import normalise_tags
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
    ingest.add_argument(
        "--tag",
        action="append",
        metavar="TAG",
        help="a tag for every page of these sources (repeat for more; replaces the tags the "
        "source had; without --tag it keeps them)",
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


_PAGES_OF_TOTAL = (
    "{desc}: {percentage:3.0f}%|{bar}| {n_fmt}/{total_fmt} pages [{elapsed}<{remaining}{postfix}]"
)
_PAGES_SO_FAR = "{desc}: {n_fmt} pages [{elapsed}{postfix}]"


class _IngestBar:
    """An ingest's progress on a terminal: pages done (out of how many, when that is known
    beforehand), chunks cut from new or changed pages, chunks embedded. It is cleared when
    the source is done, so that its one-line summary is what stays."""

    def __init__(self, label: str, stream: TextIO) -> None:
        self._bar = tqdm(
            desc=label, file=stream, leave=False, unit="page", bar_format=_PAGES_SO_FAR
        )
        self._shown = (0, 0)

    def __call__(self, progress: IngestProgress) -> None:
        bar = self._bar
        total = progress.pages_total
        if total is not None and bar.total is None:
            bar.bar_format = _PAGES_OF_TOTAL
        if total is not None:
            bar.total = max(total, progress.pages)  # a count made beforehand may fall short
        bar.set_postfix_str(f"{progress.chunks} chunks, {progress.embedded} embedded", False)
        bar.update(progress.pages - bar.n)
        if (progress.embedding, progress.embedded) != self._shown:
            # Embedding is the slow part: show where things stand as each batch starts and
            # ends, whatever the time since the last redraw.
            self._shown = (progress.embedding, progress.embedded)
            bar.refresh()

    def close(self) -> None:
        self._bar.close()


def _label(spec: SourceSpec) -> str:
    return spec.location if spec.is_remote else Path(spec.location).name or spec.location


def _warn_local_citations(spec: SourceSpec) -> None:
    print(
        f"parley: warning: without --base-url, answers cite the pages of {spec.location} by "
        "their path in it (/en/faq.html for en/faq.html), not by their address on your "
        "website; to cite the website, run again with --base-url https://www.example.com "
        "(the address the folder's files are published under)",
        file=sys.stderr,
    )


def _report_failure(spec: SourceSpec, report: IngestReport) -> None:
    """The parts that could not be read, then one line on why the source as a whole failed,
    naming each address once."""
    for error in report.errors:
        if error.location != spec.location:
            print(f"{error.location}: {error.reason}", file=sys.stderr)
    whole = next((e.reason for e in report.errors if e.location == spec.location), None)
    print(f"parley: error: {spec.location}: {whole or 'nothing could be read'}", file=sys.stderr)


async def ingest(args: argparse.Namespace, runtime: Runtime) -> int:
    """Ingest each source; unreadable parts are listed, the rest is indexed. Exit 1 on errors."""
    _check_base_url(args.base_url)
    tags = normalise_tags(args.tag, what="--tag") if args.tag else None
    specs = [parse_source(s) for s in args.sources]
    agent = await Agents(runtime.database.pool).get(args.agent)
    ingestor = Ingestor(
        KnowledgeStore(runtime.database.pool),
        runtime.embedder,
        allow_networks=runtime.settings.crawl_allow_networks,
    )
    status = 0
    for spec in specs:
        if args.base_url is None and spec.kind in ("directory", "file"):
            _warn_local_citations(spec)
        bar = _IngestBar(_label(spec), sys.stderr) if sys.stderr.isatty() else None
        try:
            report = await ingestor.ingest(
                agent, spec, base_url=args.base_url, on_progress=bar, tags=tags
            )
        finally:
            if bar is not None:
                bar.close()
        if report.failed:
            _report_failure(spec, report)
            status = 2
            continue
        for error in report.errors:
            print(f"{error.location}: {error.reason}", file=sys.stderr)
        if report.errors:
            status = max(status, 1)
        print(
            f"{spec.location}: {report.added} added, {report.updated} updated, "
            f"{report.unchanged} unchanged, {report.removed} removed, "
            f"{len(report.errors)} unreadable ({report.chunks_embedded} chunks embedded)"
        )
        agent = await Agents(runtime.database.pool).get(args.agent)
    return status


_SOURCE_COLUMNS = ("ID", "KIND", "STATUS", "PAGES", "LAST CRAWL", "LOCATION", "LAST ERROR")


def _source_row(source: SourceRecord) -> tuple[str, ...]:
    crawled = (
        source.last_crawled_at.isoformat(timespec="seconds") if source.last_crawled_at else "-"
    )
    # The error names the source's own address first; the row already does, once.
    error = " ".join((source.last_error or "").split())
    error = error.removeprefix(f"{source.location}: ")
    return (
        str(source.id),
        source.kind,
        source.status,
        str(source.pages),
        crawled,
        source.location,
        error,
    )


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]) - 1)]
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row, widths, strict=False)]
        print("  ".join([*cells, row[-1]]).rstrip())


async def sources(args: argparse.Namespace, runtime: Runtime) -> int:
    agent = await Agents(runtime.database.pool).get(args.agent)
    store = KnowledgeStore(runtime.database.pool)
    if args.action == "remove":
        removed = await store.remove_source(agent.id, args.id)
        print(f"removed source {args.id} and its {removed} pages")
        return 0
    listed = await store.list_sources(agent.id)
    if not listed:
        print(f"agent {agent.slug} has no sources; add one with `parley ingest`")
        return 0
    _print_table([_SOURCE_COLUMNS, *(_source_row(source) for source in listed)])
    return 0


async def rebuild_index(args: argparse.Namespace, runtime: Runtime) -> int:
    agent = await Agents(runtime.database.pool).get(args.agent)
    identity = EmbedderIdentity.of(runtime.embedder)
    total = await KnowledgeStore(runtime.database.pool).count_chunks(agent.id)
    with _bar(total, "chunk") as bar:

        async def embed(chunks: list[Chunk]) -> NDArray[np.float32]:
            return (await embed_chunks(runtime.embedder, chunks))[0]

        done = await reembed_agent(
            runtime.database.pool, agent.id, identity, embed, on_batch=bar.update
        )
    print(
        f"re-embedded {done} chunks of {agent.slug} with {identity.name} "
        f"({identity.dimension} dimensions)"
    )
    # The quotable pieces too, so that no turn has to encode them (this also fills in the
    # pages indexed before their pieces' vectors were stored).
    store = KnowledgeStore(runtime.database.pool)
    with _bar(len(await store.stored_pages(agent.id)), "page") as bar:
        pieces = await fill_piece_vectors(
            store,
            PieceVectors(runtime.database.pool),
            runtime.embedder,
            agent.id,
            on_batch=bar.update,
        )
    print(f"embedded {pieces} quotable pieces the extractive answers read")
    return 0


def _check_base_url(value: str | None) -> None:
    if value is not None and not value.startswith(("http://", "https://", "/")):
        raise InvalidInput("--base-url must be an http(s) URL or a path starting with /")
