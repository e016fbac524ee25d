"""Bringing a source's content into an agent's index: read, skip what is unchanged, chunk,
embed in batches (the chunks, and the pieces an extractive answer quotes), replace each
changed page in one transaction, prune what disappeared. Reading the next pages goes on
while a batch is embedded."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from core.documents import Chunk, Document, ReadError
from core.knowledge.chunk import chunk_document, embed_chunks
from core.knowledge.crawl import CrawlLimits, Unchanged, crawl
from core.knowledge.outbound import IPNetwork, crawler_session
from core.knowledge.pieces import digest, page_piece_texts
from core.knowledge.sources import HTML_SUFFIXES, TEXT_SUFFIXES, SourceSpec, read_local
from core.ports import Embedder
from core.store.agents import Agent
from core.store.knowledge import KnowledgeStore, StoredPage
from core.store.piece_vectors import PagePieces, PieceVectors, to_bytes

log = logging.getLogger(__name__)

# Chunks embedded together; a batch spans pages so that small pages share a call.
EMBED_BATCH = 128

Item = Document | ReadError | Unchanged


@dataclass
class IngestProgress:
    """How far an ingest has come, for a progress display: pages done (stored, unchanged or
    unreadable) out of ``pages_total`` when that is known beforehand (a local source),
    chunks cut from new or changed pages, how many of those are being embedded now (the
    slow part) and how many are embedded and stored."""

    pages: int = 0
    pages_total: int | None = None
    chunks: int = 0
    embedding: int = 0
    embedded: int = 0


ProgressCallback = Callable[[IngestProgress], None]


@dataclass
class IngestReport:
    source_id: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    retagged: int = 0  # kept pages whose tags changed
    chunks_embedded: int = 0
    pieces_embedded: int = 0  # quotable pieces of new or changed text
    errors: list[ReadError] = field(default_factory=list)
    failed: str | None = None  # the whole source could not be read
    knowledge_version: int | None = None

    @property
    def changed(self) -> bool:
        return bool(self.added or self.updated or self.removed)


class Ingestor:
    """The one way content gets into the index (CLI, staff console, nightly re-crawl)."""

    def __init__(
        self,
        store: KnowledgeStore,
        embedder: Embedder,
        limits: CrawlLimits | None = None,
        *,
        allow_networks: Sequence[IPNetwork] = (),
    ) -> None:
        """``allow_networks``: private networks a crawl may reach all the same (an intranet);
        every other private, loopback or link-local address is refused."""
        self._store = store
        self._embedder = embedder
        self._limits = limits or CrawlLimits()
        self._allow_networks = tuple(allow_networks)

    async def ingest(
        self,
        agent: Agent,
        spec: SourceSpec,
        *,
        base_url: str | None = None,
        on_progress: ProgressCallback | None = None,
        tags: Sequence[str] | None = None,
    ) -> IngestReport:
        """Bring ``spec``'s pages into ``agent``'s index. ``on_progress`` is called with the
        counts so far whenever they change (the same object each time). ``tags`` (normalised
        already) replace the source's own tags; without them it keeps those it has."""
        source_id = await self._store.upsert_source(agent.id, spec.kind, spec.location)
        if tags is not None:
            await self._store.set_source_tags(agent.id, source_id, tags)
        await self._store.set_source_status(source_id, "indexing", None)
        stored = await self._store.stored_pages(agent.id)
        report = IngestReport(source_id=source_id)
        progress = _Progress(on_progress)
        try:
            items = self._read(spec, source_id, base_url, stored, progress)
            seen = await self._sync(agent, source_id, items, stored, report, progress)
        except BaseException as exc:
            await self._store.set_source_status(source_id, "failed", _reason(exc))
            raise
        if report.failed is None:
            report.removed = await self._store.prune(source_id, seen)
            # Unchanged pages keep their chunks: the source's tags and the agent's URL rules
            # as they are now are applied to them here.
            report.retagged = await self._store.retag(agent.id, source_id=source_id)
        if report.changed:
            report.knowledge_version = await self._store.bump_version(agent.id)
        error = report.failed or (
            f"{len(report.errors)} unreadable: {report.errors[0].location}: "
            f"{report.errors[0].reason}"
            if report.errors
            else None
        )
        await self._store.set_source_status(
            source_id, "failed" if report.failed else "ready", error
        )
        log.info(
            "ingest.done source=%d added=%d updated=%d unchanged=%d removed=%d errors=%d",
            source_id,
            report.added,
            report.updated,
            report.unchanged,
            report.removed,
            len(report.errors),
        )
        return report

    async def _read(
        self,
        spec: SourceSpec,
        source_id: int,
        base_url: str | None,
        stored: dict[str, StoredPage],
        progress: _Progress,
    ) -> AsyncIterator[Item]:
        if not spec.is_remote:
            progress.counts.pages_total = await asyncio.to_thread(_count_local, spec)
            progress.changed()
            # A file this source read before and that is still the same is not read again
            # (one read by another source is: the page changes hands).
            known = {url: p.etag for url, p in stored.items() if p.source_id == source_id}
            # One page at a time, so that progress shows while a large folder is read and
            # embedded (reading everything first left the display still until the end).
            pages = read_local(spec, base_url, known)
            while (read := await asyncio.to_thread(next, pages, None)) is not None:
                yield read
            return
        validators = {url: (page.etag, page.last_modified) for url, page in stored.items()}
        # A session of its own, not the process's shared one: that one talks to the model
        # and embedding services, which may well sit on private addresses.
        async with crawler_session(self._allow_networks) as session:
            async for item in crawl(spec.location, session, self._limits, validators=validators):
                yield item

    async def _sync(
        self,
        agent: Agent,
        source_id: int,
        items: AsyncIterator[Item],
        stored: dict[str, StoredPage],
        report: IngestReport,
        progress: _Progress,
    ) -> set[str]:
        seen: set[str] = set()
        pending: list[tuple[Document, list[Chunk]]] = []
        pending_chunks = 0
        fetched_any = False
        # The batch being embedded and stored while the next pages are read: the reading
        # (extracting HTML above all) and the encoding each keep a core busy.
        writing: asyncio.Task[None] | None = None
        try:
            async for item in items:
                fetched_any = fetched_any or not isinstance(item, ReadError)
                queued = await self._take(agent, source_id, item, stored, seen, report)
                if queued is None:
                    progress.counts.pages += 1  # settled: nothing to embed
                    progress.changed()
                    continue
                pending.append(queued)
                pending_chunks += len(queued[1])
                progress.counts.chunks += len(queued[1])
                progress.changed()
                if pending_chunks >= EMBED_BATCH:
                    if writing is not None:
                        await writing
                    batch = list(pending)
                    writing = asyncio.create_task(
                        self._write(agent, source_id, batch, stored, report, progress)
                    )
                    pending, pending_chunks = [], 0
            if writing is not None:
                await writing
            await self._write(agent, source_id, pending, stored, report, progress)
        except asyncio.CancelledError:
            if writing is not None:
                writing.cancel()
            raise
        except BaseException:
            # The pages read before the failure are stored all the same.
            if writing is not None and not writing.done():
                with contextlib.suppress(Exception):
                    await writing
            raise
        if not fetched_any and report.errors:
            # Nothing could be read at all (site down, folder gone): keep what the index has.
            report.failed = f"{report.errors[0].location}: {report.errors[0].reason}"
        return seen

    async def _take(
        self,
        agent: Agent,
        source_id: int,
        item: Item,
        stored: dict[str, StoredPage],
        seen: set[str],
        report: IngestReport,
    ) -> tuple[Document, list[Chunk]] | None:
        """Records what ``item`` is; a new or changed page comes back with its chunks, to
        be embedded and stored."""
        if isinstance(item, ReadError):
            report.errors.append(item)
            if item.url:
                seen.add(item.url)
            return None
        if isinstance(item, Unchanged):
            seen.add(item.url)
            report.unchanged += 1
            return None
        if item.url in seen:
            return None  # two files or links resolving to one page: the first wins
        seen.add(item.url)
        known = stored.get(item.url)
        if known is not None and known.content_hash == item.content_hash:
            await self._store.touch_page(agent.id, source_id, item)
            report.unchanged += 1
            return None
        chunks = chunk_document(item)
        if not chunks:
            report.errors.append(ReadError(item.url, "no text found", item.url))
            return None
        if known is None:
            report.added += 1
        else:
            report.updated += 1
        return item, chunks

    async def _write(
        self,
        agent: Agent,
        source_id: int,
        pending: Iterable[tuple[Document, list[Chunk]]],
        stored: dict[str, StoredPage],
        report: IngestReport,
        progress: _Progress,
    ) -> None:
        batch = list(pending)
        if not batch:
            return
        every = [chunk for _, chunks in batch for chunk in chunks]
        progress.counts.embedding = len(every)
        progress.changed()
        name = self._embedder.name
        pieces = [page_piece_texts([(c.heading, c.text) for c in chunks]) for _, chunks in batch]
        digests = [[digest(text) for text in texts] for texts in pieces]
        # A changed page keeps the vectors of the pieces it still has.
        kept = await self._store.piece_vectors(
            [stored[doc.url].id for doc, _ in batch if doc.url in stored], name
        )
        new = list(
            dict.fromkeys(
                text
                for texts, keys in zip(pieces, digests, strict=True)
                for text, key in zip(texts, keys, strict=True)
                if key not in kept
            )
        )
        vectors, piece_rows = await embed_chunks(self._embedder, every, new)
        report.chunks_embedded += len(every)
        report.pieces_embedded += len(new)
        made = dict(zip(new, to_bytes(piece_rows), strict=True))
        offset = 0
        for (doc, chunks), texts, keys in zip(batch, pieces, digests, strict=True):
            rows = [kept[k] if k in kept else made[t] for t, k in zip(texts, keys, strict=True)]
            await self._store.write_page(
                agent.id,
                source_id,
                doc,
                chunks,
                vectors[offset : offset + len(chunks)],
                PagePieces(name, keys, rows),
            )
            offset += len(chunks)
        progress.counts.embedding = 0
        progress.counts.embedded += len(every)
        progress.counts.pages += len(batch)
        progress.changed()


async def fill_piece_vectors(
    store: KnowledgeStore,
    vectors: PieceVectors,
    embedder: Embedder,
    agent_id: int,
    *,
    pages: int = 20,
    on_batch: Callable[[int], None] | None = None,
) -> int:
    """Store the vectors of the quotable pieces of an agent's pages that have none from
    ``embedder`` (pages indexed before they were stored, or re-embedded since), ``pages``
    pages at a time; ``on_batch`` hears how many pages each batch had. Returns the number
    of pieces embedded."""
    done = 0
    after = 0
    while batch := await store.page_parts(agent_id, after=after, limit=pages):
        after = batch[-1][0]
        keys: list[tuple[int, bytes]] = []
        texts: list[str] = []
        for page_id, parts in batch:
            for text in page_piece_texts(parts):
                keys.append((page_id, digest(text)))
                texts.append(text)
        known = await vectors.fetch(embedder.name, embedder.dimension, keys)
        missing = [i for i, key in enumerate(keys) if key not in known]
        if missing:
            unique = list(dict.fromkeys(texts[i] for i in missing))
            made = dict(zip(unique, await embedder.embed(unique), strict=True))
            rows = np.stack([made[texts[i]] for i in missing])
            await vectors.keep(embedder.name, [keys[i] for i in missing], rows)
            done += len(unique)
        if on_batch is not None:
            on_batch(len(batch))
    return done


class _Progress:
    """The counts of one ingest and whoever wants to hear when they change."""

    def __init__(self, callback: ProgressCallback | None) -> None:
        self.counts = IngestProgress()
        self._callback = callback

    def changed(self) -> None:
        if self._callback is not None:
            self._callback(self.counts)


def _count_local(spec: SourceSpec) -> int | None:
    """About how many pages `read_local` will give for ``spec`` (a progress bar's total):
    the folder's files it reads, the .jsonl file's lines."""
    path = Path(spec.location)
    if spec.kind == "directory":
        suffixes = TEXT_SUFFIXES + HTML_SUFFIXES
        return sum(
            1
            for found in path.rglob("*")
            if found.suffix.lower() in suffixes
            and not any(part.startswith(".") for part in found.relative_to(path).parts)
        )
    if spec.kind == "jsonl":
        try:
            with path.open("rb") as lines:
                return sum(1 for line in lines if line.strip())
        except OSError:
            return None
    return 1


def _reason(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
