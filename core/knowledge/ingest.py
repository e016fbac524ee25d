"""Bringing a source's content into an agent's index: read, skip what is unchanged, chunk,
embed in batches, replace each changed page in one transaction, prune what disappeared."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field

from core.knowledge.chunk import Chunk, chunk_document
from core.knowledge.crawl import CrawlLimits, Unchanged, crawl
from core.knowledge.documents import Document, ReadError
from core.knowledge.outbound import IPNetwork, crawler_session
from core.knowledge.sources import SourceSpec, read_local
from core.ports import Embedder
from core.store.agents import Agent
from core.store.knowledge import KnowledgeStore, StoredPage

log = logging.getLogger(__name__)

# Chunks embedded together; a batch spans pages so that small pages share a call.
EMBED_BATCH = 128

Item = Document | ReadError | Unchanged


@dataclass
class IngestReport:
    source_id: int = 0
    added: int = 0
    updated: int = 0
    unchanged: int = 0
    removed: int = 0
    chunks_embedded: int = 0
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
        on_page: Callable[[], None] | None = None,
    ) -> IngestReport:
        source_id = await self._store.upsert_source(agent.id, spec.kind, spec.location)
        await self._store.set_source_status(source_id, "indexing", None)
        stored = await self._store.stored_pages(agent.id)
        report = IngestReport(source_id=source_id)
        try:
            items = self._read(spec, base_url, stored, on_page)
            seen = await self._sync(agent, source_id, items, stored, report)
        except BaseException as exc:
            await self._store.set_source_status(source_id, "failed", _reason(exc))
            raise
        if report.failed is None:
            report.removed = await self._store.prune(source_id, seen)
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
        base_url: str | None,
        stored: dict[str, StoredPage],
        on_page: Callable[[], None] | None,
    ) -> AsyncIterator[Item]:
        if not spec.is_remote:
            local = await asyncio.to_thread(lambda: list(read_local(spec, base_url)))
            for read in local:
                if on_page:
                    on_page()
                yield read
            return
        validators = {url: (page.etag, page.last_modified) for url, page in stored.items()}
        # A session of its own, not the process's shared one: that one talks to the model
        # and embedding services, which may well sit on private addresses.
        async with crawler_session(self._allow_networks) as session:
            async for item in crawl(
                spec.location, session, self._limits, validators=validators, on_page=on_page
            ):
                yield item

    async def _sync(
        self,
        agent: Agent,
        source_id: int,
        items: AsyncIterator[Item],
        stored: dict[str, StoredPage],
        report: IngestReport,
    ) -> set[str]:
        seen: set[str] = set()
        pending: list[tuple[Document, list[Chunk]]] = []
        pending_chunks = 0
        fetched_any = False
        async for item in items:
            if isinstance(item, ReadError):
                report.errors.append(item)
                if item.url:
                    seen.add(item.url)
                continue
            fetched_any = True
            if isinstance(item, Unchanged):
                seen.add(item.url)
                report.unchanged += 1
                continue
            if item.url in seen:
                continue  # two files or links resolving to one page: the first wins
            seen.add(item.url)
            known = stored.get(item.url)
            if known is not None and known.content_hash == item.content_hash:
                await self._store.touch_page(agent.id, source_id, item)
                report.unchanged += 1
                continue
            chunks = chunk_document(item)
            if not chunks:
                report.errors.append(ReadError(item.url, "no text found", item.url))
                continue
            if known is None:
                report.added += 1
            else:
                report.updated += 1
            pending.append((item, chunks))
            pending_chunks += len(chunks)
            if pending_chunks >= EMBED_BATCH:
                await self._write(agent, source_id, pending, report)
                pending, pending_chunks = [], 0
        await self._write(agent, source_id, pending, report)
        if not fetched_any and report.errors:
            # Nothing could be read at all (site down, folder gone): keep what the index has.
            report.failed = f"{report.errors[0].location}: {report.errors[0].reason}"
        return seen

    async def _write(
        self,
        agent: Agent,
        source_id: int,
        pending: Iterable[tuple[Document, list[Chunk]]],
        report: IngestReport,
    ) -> None:
        batch = list(pending)
        if not batch:
            return
        inputs = [chunk.embedding_input() for _, chunks in batch for chunk in chunks]
        vectors = await self._embedder.embed(inputs)
        report.chunks_embedded += len(inputs)
        offset = 0
        for doc, chunks in batch:
            await self._store.write_page(
                agent.id, source_id, doc, chunks, vectors[offset : offset + len(chunks)]
            )
            offset += len(chunks)


def _reason(exc: BaseException) -> str:
    return str(exc).splitlines()[0] if str(exc) else type(exc).__name__
