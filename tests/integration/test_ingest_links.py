"""`parley ingest DIR` reads only what lies inside DIR: links that leave it are skipped, named."""

from __future__ import annotations

from pathlib import Path

from core.knowledge.ingest import Ingestor
from core.knowledge.sources import parse_source
from core.retrieval.embedders import UseEmbedder
from core.store import Agents, Database
from core.store.knowledge import KnowledgeStore
from core.store.vector_index import EmbedderIdentity

SECRET = "# Server notes\nThe database password is hunter2-outside-the-folder.\n"


async def test_links_out_of_the_folder_are_skipped_and_reported(
    database: Database, use_embedder: UseEmbedder, tmp_path: Path
) -> None:
    outside = tmp_path / "outside"
    (outside / "notes").mkdir(parents=True)
    (outside / "secret.md").write_text(SECRET, encoding="utf-8")
    (outside / "notes" / "more.md").write_text(SECRET, encoding="utf-8")
    site = tmp_path / "site"
    (site / "help").mkdir(parents=True)
    (site / "returns.md").write_text("# Returns\nReturns are free for 30 days.\n")
    (site / "help" / "shipping.md").write_text("# Shipping\nParcels arrive in 2 days.\n")
    (site / "leak.md").symlink_to(outside / "secret.md")  # a file outside
    (site / "notes").symlink_to(outside / "notes", target_is_directory=True)  # a folder
    (site / "up.md").symlink_to(Path("..") / "outside" / "secret.md")  # relative, outside
    (site / "alias.md").symlink_to(site / "returns.md")  # inside: read
    (site / "loop.md").symlink_to(site / "loop.md")

    agent = await Agents(database.pool).create("shop", embedder=EmbedderIdentity.of(use_embedder))
    store = KnowledgeStore(database.pool)
    report = await Ingestor(store, use_embedder).ingest(agent, parse_source(str(site)))

    skipped = {(e.location, e.reason) for e in report.errors}
    assert skipped == {
        (str(site / "leak.md"), "skipped: links outside the folder"),
        (str(site / "notes"), "skipped: links outside the folder"),
        (str(site / "up.md"), "skipped: links outside the folder"),
        (str(site / "loop.md"), "skipped: a loop of symbolic links"),
    }
    assert report.added == 3  # returns.md, alias.md, help/shipping.md
    urls = await database.pool.fetch("SELECT url FROM pages ORDER BY url")
    assert [r["url"] for r in urls] == ["/alias.md", "/help/shipping.md", "/returns.md"]
    leaked = await database.pool.fetchval("SELECT count(*) FROM chunks WHERE text LIKE '%hunter2%'")
    assert leaked == 0
