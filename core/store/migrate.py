"""Applies the numbered SQL files in `migrations/` in order, once each, under an advisory lock."""

from __future__ import annotations

import hashlib
import logging
import re
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import asyncpg

from core.errors import ConfigError, StoreUnavailable

log = logging.getLogger(__name__)

# pg_advisory_lock key shared by every process that migrates this database.
_LOCK_KEY = 0x7061726C6579  # "parley"
_FILE = re.compile(r"^(\d{4})_([a-z0-9_]+)\.sql$")
# The oldest pgvector Parley runs on: retrieval relies on what 0.8 brought (halfvec storage,
# iterative index scans with hnsw.iterative_scan).
PGVECTOR_REQUIRED = (0, 8, 0)


@dataclass(frozen=True, slots=True)
class Migration:
    version: int
    name: str
    sql: str

    @property
    def checksum(self) -> str:
        return hashlib.sha256(self.sql.encode()).hexdigest()


def bundled_migrations(directory: Path | None = None) -> list[Migration]:
    """The migrations shipped with Parley (or those in ``directory``), by version."""
    root = directory or Path(str(resources.files("core.store") / "migrations"))
    found = []
    for path in sorted(root.iterdir()):
        match = _FILE.match(path.name)
        if match:
            found.append(Migration(int(match[1]), match[2], path.read_text("utf-8")))
    versions = [m.version for m in found]
    if len(set(versions)) != len(versions):
        raise ConfigError(f"two migrations share a version number in {root}")
    return found


async def migrate(conn: asyncpg.Connection, migrations: list[Migration] | None = None) -> list[int]:
    """Bring the database up to date; returns the versions applied now (empty when current).

    Safe when several processes start at once: they queue on one advisory lock, and each
    re-reads what is applied after taking it. An edited migration that was applied already
    stops the start, since the database no longer matches the files.
    """
    pending = migrations if migrations is not None else bundled_migrations()
    await conn.execute("SELECT pg_advisory_lock($1)", _LOCK_KEY)
    try:
        await require_pgvector(conn)
        await conn.execute(
            """CREATE TABLE IF NOT EXISTS schema_migrations (
                   version    integer PRIMARY KEY,
                   name       text NOT NULL,
                   checksum   text NOT NULL,
                   applied_at timestamptz NOT NULL DEFAULT now())"""
        )
        rows = await conn.fetch("SELECT version, checksum FROM schema_migrations")
        applied = {r["version"]: r["checksum"] for r in rows}
        done: list[int] = []
        for migration in pending:
            known = applied.get(migration.version)
            if known is not None:
                if known != migration.checksum:
                    raise ConfigError(
                        f"migration {migration.version:04d}_{migration.name} was changed after "
                        "it was applied; add a new migration instead of editing an old one"
                    )
                continue
            try:
                async with conn.transaction():
                    await conn.execute(migration.sql)
                    await conn.execute(
                        "INSERT INTO schema_migrations (version, name, checksum) "
                        "VALUES ($1, $2, $3)",
                        migration.version,
                        migration.name,
                        migration.checksum,
                    )
            except asyncpg.FeatureNotSupportedError as exc:
                raise StoreUnavailable(_explain(migration, exc)) from exc
            except asyncpg.UndefinedFileError as exc:
                raise StoreUnavailable(_explain(migration, exc)) from exc
            log.info("store.migrated version=%04d name=%s", migration.version, migration.name)
            done.append(migration.version)
        return done
    finally:
        await conn.execute("SELECT pg_advisory_unlock($1)", _LOCK_KEY)


async def require_pgvector(conn: asyncpg.Connection) -> None:
    """Raise `StoreUnavailable` when the database has, or the server offers, a pgvector older
    than `PGVECTOR_REQUIRED`, naming the version found and how to get a newer one.

    Checked before any migration runs, so an old pgvector stops the start with this message
    rather than with a migration or a query failing on a type or setting it does not know.
    A server without pgvector at all is reported by the first migration, which creates it.
    """
    row = await conn.fetchrow(
        """SELECT (SELECT extversion FROM pg_extension WHERE extname = 'vector') AS installed,
                  (SELECT default_version FROM pg_available_extensions
                    WHERE name = 'vector') AS available,
                  current_database() AS database"""
    )
    assert row is not None
    installed, available = row["installed"], row["available"]
    required = ".".join(map(str, PGVECTOR_REQUIRED))
    newer = "the image pgvector/pgvector:pg18 has it"
    update = f'`ALTER EXTENSION vector UPDATE;` in the database "{row["database"]}"'
    if installed is None:
        if available is None or _version(available) >= PGVECTOR_REQUIRED:
            return
        raise StoreUnavailable(
            f"this PostgreSQL server has pgvector {available} and Parley needs pgvector "
            f"{required} or newer: install a newer pgvector on the server ({newer}), or unset "
            "PARLEY_DATABASE_URL to use the embedded PostgreSQL"
        )
    if _version(installed) >= PGVECTOR_REQUIRED:
        return
    if available is not None and _version(available) >= PGVECTOR_REQUIRED:
        how = f"the server has pgvector {available}: run {update}"
    else:
        how = f"install a newer pgvector on the server ({newer}), then run {update}"
    raise StoreUnavailable(
        f"this database has pgvector {installed} and Parley needs pgvector {required} or "
        f"newer: {how} (as a superuser or the extension's owner)"
    )


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in re.findall(r"\d+", text)[:3])


def _explain(migration: Migration, exc: Exception) -> str:
    detail = str(exc).splitlines()[0]
    hint = ""
    if "vector" in detail:
        hint = (
            "; this PostgreSQL server has no pgvector extension: install it, or unset "
            "PARLEY_DATABASE_URL to use the embedded PostgreSQL with pgvector"
        )
    return f"migration {migration.version:04d}_{migration.name} failed: {detail}{hint}"
