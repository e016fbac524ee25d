"""The embedded PostgreSQL 16 + pgvector (from the `pgserver` package) used when no URL is set."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import warnings
from pathlib import Path
from typing import Any

import asyncpg

from core.errors import StoreUnavailable

log = logging.getLogger(__name__)

DATABASE = "parley"


class EmbeddedPostgres:
    """A PostgreSQL server in ``data_dir/postgres``, shared by every Parley process using it.

    pgserver starts the server on first use, finds and reuses a running one (also from
    another process), and stops it when the last process that uses it lets go.
    """

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = data_dir.expanduser().resolve() / "postgres"
        self._server: Any = None

    async def start(self) -> str:
        """Start (or join) the server and return a URL for the ``parley`` database."""
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._server = await asyncio.to_thread(_get_server, self.pgdata)
        except Exception as exc:  # pgserver raises bare subprocess and OS errors
            raise StoreUnavailable(
                f"could not start the embedded PostgreSQL in {self.pgdata}: {exc} "
                f"(see {self.pgdata / 'log'})"
            ) from exc
        admin_url = self._server.get_uri("postgres")
        conn = await asyncpg.connect(admin_url)
        try:
            exists = await conn.fetchval("SELECT 1 FROM pg_database WHERE datname = $1", DATABASE)
            if not exists:
                # Another process may create it first; either way it exists afterwards.
                with contextlib.suppress(asyncpg.DuplicateDatabaseError):
                    await conn.execute(f'CREATE DATABASE "{DATABASE}"')
        finally:
            await conn.close()
        log.info("store.embedded.started pgdata=%s", self.pgdata)
        url: str = self._server.get_uri(DATABASE)
        return url

    async def stop(self) -> None:
        """Let go of the server; it stops when no other process still uses it."""
        if self._server is not None:
            server, self._server = self._server, None
            await asyncio.to_thread(server.cleanup)
            log.info("store.embedded.released pgdata=%s", self.pgdata)


def _get_server(pgdata: Path) -> Any:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset; harmless here.
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import get_server

    return get_server(pgdata, cleanup_mode="stop")
