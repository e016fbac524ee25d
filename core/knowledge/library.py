"""An agent's sources as staff manage them: added and re-indexed in the background, removed."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from typing import cast

from core.errors import Conflict
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import SourceKind, SourceSpec
from core.store.agents import Agent
from core.store.knowledge import KnowledgeStore, PageRecord, SourceRecord

log = logging.getLogger(__name__)


class SourceLibrary:
    """Ingestion can take minutes (a whole site), so it runs in a task of this process and
    the caller gets the source back at once, status "indexing"; its status, last crawl and
    error tell how it went. One run per source at a time."""

    def __init__(self, store: KnowledgeStore, ingestor: Ingestor) -> None:
        self._store = store
        self._ingestor = ingestor
        self._runs: dict[int, asyncio.Task[None]] = {}

    async def list(self, agent: Agent) -> list[SourceRecord]:
        return await self._store.list_sources(agent.id)

    async def get(self, agent: Agent, source_id: int) -> SourceRecord:
        return await self._store.get_source(agent.id, source_id)

    def running(self, source_id: int) -> bool:
        return source_id in self._runs

    async def add(
        self, agent: Agent, spec: SourceSpec, tags: Sequence[str] | None = None
    ) -> SourceRecord:
        """Record the source (with ``tags`` for its pages, when given) and start indexing it."""
        if spec.kind == "text":
            source_id = await self._store.save_text(agent.id, spec.location, spec.text or "")
        else:
            source_id = await self._store.upsert_source(agent.id, spec.kind, spec.location)
        if tags is not None:
            await self._store.set_source_tags(agent.id, source_id, tags)
        return await self._start(agent, source_id, spec)

    async def set_tags(self, agent: Agent, source_id: int, tags: Sequence[str]) -> SourceRecord:
        """The source's own tags, given to its pages and their chunks at once."""
        await self._store.set_source_tags(agent.id, source_id, tags)
        return await self._store.get_source(agent.id, source_id)

    async def pages(
        self, agent: Agent, source_id: int, *, after: int = 0, limit: int = 100
    ) -> Sequence[PageRecord]:
        await self._store.get_source(agent.id, source_id)  # 404 for another agent's
        return await self._store.list_pages(agent.id, source_id, after=after, limit=limit)

    async def tag_page(self, agent: Agent, page_id: int, tags: Sequence[str] | None) -> PageRecord:
        """A page's own tags as staff set them (None: as its source gives them again)."""
        return await self._store.set_page_tags(agent.id, page_id, tags)

    async def retag(self, agent: Agent) -> int:
        """Apply the agent's URL rules as they are now to every page it has."""
        return await self._store.retag(agent.id)

    async def reindex(self, agent: Agent, source_id: int) -> SourceRecord:
        """Read the source again; unchanged pages are kept as they are."""
        source = await self._store.get_source(agent.id, source_id)
        text = await self._store.source_text(source_id) if source.kind == "text" else None
        spec = SourceSpec(cast(SourceKind, source.kind), source.location, text)
        return await self._start(agent, source_id, spec)

    async def remove(self, agent: Agent, source_id: int) -> int:
        """Delete the source with its pages (stopping a run first); returns pages removed."""
        await self._store.get_source(agent.id, source_id)
        run = self._runs.get(source_id)
        if run is not None:
            run.cancel()
            await asyncio.gather(run, return_exceptions=True)
        return await self._store.remove_source(agent.id, source_id)

    async def wait(self) -> None:
        """Until every run started so far has ended (tests, shutdown)."""
        while self._runs:
            await asyncio.gather(*self._runs.values(), return_exceptions=True)

    async def close(self) -> None:
        """Stop runs still going; their sources are marked failed and can be re-indexed."""
        for run in self._runs.values():
            run.cancel()
        await self.wait()

    async def _start(self, agent: Agent, source_id: int, spec: SourceSpec) -> SourceRecord:
        if source_id in self._runs:
            raise Conflict(f"source {source_id} is being indexed already")
        await self._store.set_source_status(source_id, "indexing", None)
        started = await self._store.get_source(agent.id, source_id)
        task = asyncio.create_task(self._run(agent, source_id, spec))
        self._runs[source_id] = task
        task.add_done_callback(lambda _: self._runs.pop(source_id, None))
        return started

    async def _run(self, agent: Agent, source_id: int, spec: SourceSpec) -> None:
        try:
            await self._ingestor.ingest(agent, spec)
        except asyncio.CancelledError:
            raise
        except Exception:
            # The ingestor has marked the source failed with the reason staff will see.
            log.exception("sources.ingest.crashed source=%d", source_id)
