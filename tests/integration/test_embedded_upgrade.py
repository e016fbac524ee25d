"""A data folder of the embedded PostgreSQL 16 an older Parley ran (from `pgserver`) is upgraded
to PostgreSQL 18 at the next start and kept as ``postgres-16``, or, without PostgreSQL 16's
programs, the start is refused with the command that installs them; and a pgvector older than
0.8 stops `migrate` with the versions found and needed.

The PostgreSQL 16 folder is a real one, made once per module with pgserver's programs (the
`pg16-upgrade` extra, part of the `dev` extras) and copied for each test.
"""

from __future__ import annotations

import asyncio
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import asyncpg
import pytest
from pgvector.asyncpg import register_vector

from core.errors import StoreUnavailable
from core.store.embedded import EmbeddedPostgres
from core.store.migrate import PGVECTOR_REQUIRED, bundled_migrations, migrate
from tests.support.cli import PARLEY, clean_env, run_parley
from tests.support.services import with_database

# The migrations Parley had while its embedded server was PostgreSQL 16 with pgvector 0.6.
OLD_MIGRATIONS = [m for m in bundled_migrations() if m.version <= 22]
LATEST = bundled_migrations()[-1].version
# The bundled embedder's, as agents made by `parley agent create` record it.
EMBEDDER, DIM = "use:universal-sentence-encoder-multilingual-3", 512
VECTOR = [0.6, 0.8] + [0.0] * (DIM - 2)
TEXT = "Orders to Belgium arrive in 2-3 working days."
URL = "https://shop.example/shipping"


def _pg16_server(pgdata: Path) -> Any:
    import pgserver

    return pgserver.get_server(pgdata, cleanup_mode="stop")


async def _fill_like_an_older_parley(admin_url: str) -> None:
    """What an older Parley left: its migrations applied (bookkept as its `migrate` did),
    an agent with its own HNSW index, a page and a chunk with a vector."""
    admin = await asyncpg.connect(admin_url)
    await admin.execute('CREATE DATABASE "parley"')
    await admin.close()
    conn = await asyncpg.connect(with_database(admin_url, "parley"))
    try:
        await conn.execute(
            """CREATE TABLE schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   checksum   text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        for migration in OLD_MIGRATIONS:
            async with conn.transaction():
                await conn.execute(migration.sql)
                await conn.execute(
                    "INSERT INTO schema_migrations (version, name, checksum) VALUES ($1, $2, $3)",
                    migration.version,
                    migration.name,
                    migration.checksum,
                )
        await register_vector(conn)
        agent = await conn.fetchval(
            """INSERT INTO agents (slug, name, widget_key, embedder, embedding_dim)
               VALUES ('shop', 'Shop', 'wk-shop', $1, $2) RETURNING id""",
            EMBEDDER,
            DIM,
        )
        await conn.execute(
            f"CREATE INDEX chunks_embedding_agent_{agent} ON chunks "
            f"USING hnsw ((embedding::vector({DIM})) vector_cosine_ops) WHERE agent_id = {agent}"
        )
        source = await conn.fetchval(
            "INSERT INTO sources (agent_id, kind, location) VALUES ($1, 'text', 'shop') "
            "RETURNING id",
            agent,
        )
        page = await conn.fetchval(
            """INSERT INTO pages (agent_id, source_id, url, title, locale, content_hash)
               VALUES ($1, $2, $3, 'Shipping', 'en', '\\x01') RETURNING id""",
            agent,
            source,
            URL,
        )
        await conn.execute(
            """INSERT INTO chunks (agent_id, page_id, ord, text, locale, embedding)
               VALUES ($1, $2, 0, $3, 'en', $4)""",
            agent,
            page,
            TEXT,
            VECTOR,
        )
    finally:
        await conn.close()


@pytest.fixture(scope="module")
def workdir() -> Iterator[Path]:
    # Outside pytest's temporary root, which other pytest runs make private again while a
    # server running as another user (tests run as root) still needs to reach its data.
    with tempfile.TemporaryDirectory(prefix="parley-test-pg16-") as folder:
        yield Path(folder)


@pytest.fixture(scope="module")
def pg16_folder(workdir: Path) -> Path:
    """A stopped PostgreSQL 16 data folder as an older Parley left it in ``.parley/postgres``."""
    pgdata = workdir / "template" / "postgres"
    pgdata.parent.mkdir()
    server = _pg16_server(pgdata)
    try:
        asyncio.run(_fill_like_an_older_parley(server.get_uri("postgres")))
    finally:
        server.cleanup()
    assert (pgdata / "PG_VERSION").read_text().strip() == "16"
    return pgdata


@pytest.fixture
def data_dir(workdir: Path, pg16_folder: Path) -> Path:
    """A ``PARLEY_DATA_DIR`` holding a copy of the PostgreSQL 16 folder (owners kept)."""
    data = workdir / uuid.uuid4().hex[:8]
    data.mkdir()
    subprocess.run(["cp", "-a", str(pg16_folder), str(data / "postgres")], check=True)
    return data


def _postmaster_running(pgdata: Path) -> bool:
    return (pgdata / "postmaster.pid").exists()


async def test_a_postgresql_16_folder_is_upgraded_once_by_processes_starting_together(
    data_dir: Path,
) -> None:
    procs = [
        subprocess.Popen(
            [PARLEY, "migrate"],
            cwd=data_dir,
            env=clean_env(PARLEY_DATA_DIR=str(data_dir)),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=180) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for out, _ in outputs:
        assert f"database is at migration {LATEST:04d} (embedded PostgreSQL)" in out
    logs = "".join(err for _, err in outputs)
    assert logs.count("store.embedded.upgrading") == 1, logs
    assert logs.count("store.embedded.upgraded") == 1, logs

    pgdata = data_dir / "postgres"
    kept = data_dir / "postgres-16"
    assert sorted(p.name for p in data_dir.iterdir() if p.is_dir()) == ["postgres", "postgres-16"]
    assert (pgdata / "PG_VERSION").read_text().strip() == "18"
    assert (kept / "PG_VERSION").read_text().strip() == "16"  # the shop's old data, untouched
    assert (kept / "base").is_dir()
    assert not _postmaster_running(pgdata)
    assert not _postmaster_running(kept)
    listed = run_parley("agent", "list", cwd=data_dir, PARLEY_DATA_DIR=str(data_dir))
    assert listed.stdout.startswith("shop\t"), listed.stderr

    embedded = EmbeddedPostgres(data_dir)
    conn = await asyncpg.connect(await embedded.start())
    try:
        await register_vector(conn)
        assert (await conn.fetchval("SHOW server_version")).startswith("18.")
        vector = await conn.fetchval("SELECT extversion FROM pg_extension WHERE extname = 'vector'")
        assert tuple(int(p) for p in vector.split(".")) >= PGVECTOR_REQUIRED
        # The agent's HNSW index came along, built again by pgvector 0.8, and answers.
        assert await conn.fetchval(
            """SELECT indisvalid FROM pg_index
                WHERE indexrelid = 'chunks_embedding_agent_1'::regclass"""
        )
        await conn.execute("SET enable_seqscan = off")
        nearest = await conn.fetch(
            f"""SELECT c.text, c.embedding, p.url FROM chunks c JOIN pages p ON p.id = c.page_id
                 WHERE c.agent_id = 1
                 ORDER BY c.embedding::halfvec({DIM}) <=> $1::halfvec({DIM}) LIMIT 5""",
            [0.5, 0.9, 0.1] + [0.0] * (DIM - 3),
        )
        assert [(r["text"], r["url"]) for r in nearest] == [(TEXT, URL)]
        assert nearest[0]["embedding"].to_list() == pytest.approx(VECTOR, abs=1e-3)
    finally:
        await conn.close()
        await embedded.stop()
    assert not _postmaster_running(pgdata)


def test_without_postgresql_16_programs_the_start_names_the_command(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "pgserver", None)  # as when it is not installed
    result = run_parley("migrate", cwd=data_dir, PARLEY_DATA_DIR=str(data_dir))

    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    (line,) = result.stderr.strip().splitlines()
    pgdata = data_dir / "postgres"
    assert line.startswith(
        f"parley: error: the embedded PostgreSQL in {pgdata} was made by PostgreSQL 16, which "
        "this Parley's PostgreSQL 18 cannot open; to upgrade it (the old folder is kept as "
        "postgres-16), install PostgreSQL 16's programs with "
        f"`{sys.executable} -m pip install 'pgserver>=0.1.4,<0.2'` and start Parley again"
    ), line
    # Nothing was touched: the folder is still PostgreSQL 16's, nothing runs in it.
    assert (pgdata / "PG_VERSION").read_text().strip() == "16"
    assert sorted(p.name for p in data_dir.iterdir() if p.is_dir()) == ["postgres"]
    assert not _postmaster_running(pgdata)


async def test_a_pgvector_older_than_0_8_stops_migrate_with_both_versions(
    pg16_folder: Path,
) -> None:
    """On a server of its own (PARLEY_DATABASE_URL) with pgvector 0.6.2: PostgreSQL 16's."""
    server = await asyncio.to_thread(_pg16_server, pg16_folder)
    admin_url = server.get_uri("postgres")
    names = ["fresh_db", "old_vector_db"]
    admin = await asyncpg.connect(admin_url)
    try:
        for name in names:
            await admin.execute(f'CREATE DATABASE "{name}"')
        fresh = await asyncpg.connect(with_database(admin_url, "fresh_db"))
        try:
            with pytest.raises(StoreUnavailable) as offered:
                await migrate(fresh)
            tables = await fresh.fetchval(
                "SELECT count(*) FROM pg_tables WHERE schemaname = 'public'"
            )
        finally:
            await fresh.close()
        assert offered.value.message.startswith(
            "this PostgreSQL server has pgvector 0.6.2 and Parley needs pgvector 0.8.0 or "
            "newer: install a newer pgvector on the server (the image pgvector/pgvector:pg18 "
            "has it)"
        )
        assert tables == 0  # stopped before the first migration

        old = await asyncpg.connect(with_database(admin_url, "old_vector_db"))
        try:
            await old.execute("CREATE EXTENSION vector")
            with pytest.raises(StoreUnavailable) as installed:
                await migrate(old)
        finally:
            await old.close()
        assert installed.value.message == (
            "this database has pgvector 0.6.2 and Parley needs pgvector 0.8.0 or newer: "
            "install a newer pgvector on the server (the image pgvector/pgvector:pg18 has it), "
            'then run `ALTER EXTENSION vector UPDATE;` in the database "old_vector_db" '
            "(as a superuser or the extension's owner)"
        )
    finally:
        for name in names:
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
        await admin.close()
        await asyncio.to_thread(server.cleanup)
