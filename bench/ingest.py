"""Ingestion speed: a whole ingest against the encoder alone on the same texts, and an
unchanged re-ingest against the first.

    .venv/bin/python -m bench.ingest                  # the bundled shop, 3 copies of it
    .venv/bin/python -m bench.ingest --copies 1       # the shop as it is (53 pages)

A site is written to a temp folder: `--copies` copies of `bench/data/shop/` (each file under
a name of its own, `en/shipping-2.html`, so every copy is a page of its own). Then, in one
process, on an embedded PostgreSQL in a temp dir (or PARLEY_DATABASE_URL):

1. ingest: `Ingestor.ingest` on the folder, as `parley ingest --agent bench FOLDER` runs it
   (reading and extracting each file, chunking, cutting the quotable pieces, embedding both
   with the bundled encoder, writing each page with its chunks and pieces' vectors);
   every call it makes to the encoder is recorded;
2. encode: the same calls again, text for text and call for call (the same batches), on the
   same encoder, timed alone: the encoder's own rate on exactly the texts ingest embeds;
3. re-ingest: the same folder again, nothing changed.

Printed: texts embedded, the encoder's texts/s, the ingest's texts/s end to end and its ratio
to the encoder's, pages/s, and the re-ingest's time and speedup over the first. The encoder's
weights and the language identifier are loaded before anything is timed (a fixed cost of any
process that ingests, whatever the site's size).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
from numpy.typing import NDArray

from bench.database import bench_settings
from bench.figures import record
from core.knowledge.extract import extract_page
from core.knowledge.ingest import Ingestor, IngestReport
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, open_database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity

SHOP = Path(__file__).parent / "data" / "shop"
AGENT = "bench"


class RecordingEmbedder:
    """The bundled encoder, keeping the texts of every call made to it."""

    def __init__(self, inner: UseEmbedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.calls: list[list[str]] = []

    async def embed(self, texts: Sequence[str]) -> NDArray[np.float32]:
        self.calls.append(list(texts))
        return await self.inner.embed(texts)


def write_site(root: Path, copies: int) -> int:
    """``copies`` copies of the shop's pages under ``root``, each copy's pages at addresses
    of their own (file names and canonical links); returns the number of files."""
    files = [p for p in SHOP.rglob("*") if p.suffix in (".html", ".md", ".txt")]
    for number in range(1, copies + 1):
        for path in files:
            relative = path.relative_to(SHOP)
            name = relative if number == 1 else relative.with_stem(f"{relative.stem}-{number}")
            (root / name).parent.mkdir(parents=True, exist_ok=True)
            text = path.read_text(encoding="utf-8")
            if number > 1:
                text = re.sub(r'(rel="canonical" href="[^"]*?)(\.html)"', rf'\1-{number}\2"', text)
            (root / name).write_text(text, encoding="utf-8")
    return len(files) * copies


async def _timed_ingest(
    ingestor: Ingestor, agents: Agents, site: Path
) -> tuple[float, IngestReport]:
    agent = await agents.get(AGENT)
    started = time.perf_counter()
    report = await ingestor.ingest(agent, parse_source(str(site)))
    return time.perf_counter() - started, report


async def run(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="parley-site-") as tmp:
        site = Path(tmp) / "site"
        files = write_site(site, args.copies)
        async with bench_settings() as settings:
            database = await open_database(settings, max_size=4)
            encoder = UseEmbedder()
            recording = RecordingEmbedder(encoder)
            agents = Agents(database.pool)
            await agents.create(AGENT, embedder=EmbedderIdentity.of(encoder), language="en")
            # Loaded once per process whatever is ingested: the encoder's weights, the HTML
            # extractor and the language identifier.
            await encoder.embed(["warm"])
            extract_page((SHOP / "index.html").read_bytes(), "/index.html")
            ingestor = Ingestor(KnowledgeStore(database.pool), recording)

            first, report = await _timed_ingest(ingestor, agents, site)
            calls = list(recording.calls)
            texts = sum(len(c) for c in calls)
            started = time.perf_counter()
            for call in calls:
                await encoder.embed(call)
            encode = time.perf_counter() - started
            again, unchanged = await _timed_ingest(ingestor, agents, site)
            await database.close()

    print(
        f"\n{files} files ({args.copies} x the shop): {report.added} pages, "
        f"{report.chunks_embedded} chunks and {report.pieces_embedded} pieces embedded "
        f"({texts} texts in {len(calls)} calls)\n"
    )
    print(f"{'':<28}{'seconds':>9}{'texts/s':>9}{'pages/s':>9}")
    print(f"{'encoder alone, same calls':<28}{encode:>9.2f}{texts / encode:>9.0f}{'':>9}")
    print(
        f"{'ingest, end to end':<28}{first:>9.2f}{texts / first:>9.0f}{report.added / first:>9.1f}"
    )
    print(
        f"{'re-ingest, unchanged':<28}{again:>9.2f}{'':>9}{unchanged.unchanged / again:>9.1f}"
        f"   ({unchanged.unchanged} unchanged, {unchanged.chunks_embedded} chunks embedded)"
    )
    print(f"\ningest / encoder: {encode / first:.2f} of the encoder's rate")
    print(f"re-ingest: {first / again:.0f}x faster than the first ingest")
    record("ingest rate, end to end", texts / first, "texts/s", floor=texts / encode,
           ratio_aim=(">=", 0.8))  # fmt: skip
    record("unchanged re-ingest", again, "s", floor=first, ratio_aim=("<=", 1 / 20))


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--copies", type=int, default=3, help="copies of the shop in the site")
    return parser


if __name__ == "__main__":
    asyncio.run(run(_parser().parse_args()))
