"""The nightly re-crawl: every URL and sitemap source of every agent read again.

Unchanged pages cost a conditional request (ETag / Last-Modified) or a content-hash
comparison; only pages whose content changed are chunked and embedded again.
"""

from __future__ import annotations

import logging
from typing import Any

from core.jobs.scheduler import JobResult
from core.knowledge.ingest import Ingestor
from core.knowledge.sources import SourceKind, SourceSpec
from core.store.agents import Agents
from core.store.knowledge import KnowledgeStore

log = logging.getLogger(__name__)

_COUNTS = ("added", "updated", "unchanged", "removed", "chunks_embedded", "unreadable")


async def recrawl(agents: Agents, store: KnowledgeStore, ingestor: Ingestor) -> JobResult:
    """Re-ingest each remote source; one that cannot be read is counted and the rest go on."""
    totals = dict.fromkeys(_COUNTS, 0)
    sources: list[dict[str, Any]] = []
    failed = 0
    for agent in await agents.list():
        for source in await store.list_sources(agent.id):
            if source.kind not in ("url", "sitemap"):
                continue
            kind: SourceKind = "sitemap" if source.kind == "sitemap" else "url"
            entry: dict[str, Any] = {
                "agent": agent.slug,
                "source_id": source.id,
                "location": source.location,
            }
            try:
                report = await ingestor.ingest(agent, SourceSpec(kind, source.location))
            except Exception as exc:
                # The source is marked failed with the reason by the ingestor; the job goes on.
                log.exception("recrawl.source.failed source=%d", source.id)
                entry["failed"] = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            else:
                counts = {
                    "added": report.added,
                    "updated": report.updated,
                    "unchanged": report.unchanged,
                    "removed": report.removed,
                    "chunks_embedded": report.chunks_embedded,
                    "unreadable": len(report.errors),
                }
                entry.update(counts)
                for key, value in counts.items():
                    totals[key] += value
                if report.failed:
                    entry["failed"] = report.failed
            failed += "failed" in entry
            sources.append(entry)
    agent_count = len({s["agent"] for s in sources})
    summary = (
        f"{len(sources)} sources of {agent_count} agents: {totals['added']} pages added, "
        f"{totals['updated']} updated, {totals['unchanged']} unchanged, "
        f"{totals['removed']} removed, {totals['unreadable']} unreadable; "
        f"{totals['chunks_embedded']} chunks embedded; {failed} sources failed"
    )
    return JobResult(summary, {**totals, "sources": sources, "failed": failed})
