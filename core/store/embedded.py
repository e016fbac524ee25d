"""The embedded PostgreSQL 16 + pgvector (from the `pgserver` package) used when no URL is set."""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import warnings
from pathlib import Path
from typing import Any

import asyncpg

from core.errors import StoreUnavailable

log = logging.getLogger(__name__)

DATABASE = "parley"
# pgserver's list of the processes using the server, in its data directory.
USERS_FILE = ".handle_pids.json"


class EmbeddedPostgres:
    """A PostgreSQL server in ``data_dir/postgres``, shared by every Parley process using it.

    pgserver starts the server on first use, finds and reuses a running one (also from
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
            await asyncio.to_thread(_release, server)
            log.info("store.embedded.released pgdata=%s", self.pgdata)


def _get_server(pgdata: Path) -> Any:
    with warnings.catch_warnings():
        # platformdirs warns at import when XDG_RUNTIME_DIR is unset; harmless here.
        warnings.simplefilter("ignore")
        from pgserver.postgres_server import PostgresServer, get_server

    _forget_dead_users(pgdata, PostgresServer._lock)
    return get_server(pgdata, cleanup_mode="stop")


def _release(server: Any) -> None:
    # A user killed since this process started must not keep the server running either.
    _forget_dead_users(server.pgdata, type(server)._lock)
    server.cleanup()


def _forget_dead_users(pgdata: Path, lock: Any) -> None:
    """Take processes that no longer exist off pgserver's list of the server's users.

    pgserver stops the server when the last process on that list lets go; a process that
    was killed (SIGKILL, the OOM killer) never takes itself off, so without this the server
    would outlive every graceful stop after it. The list is read and written under
    pgserver's own inter-process lock, the one it holds while changing the list.
    """
    path = pgdata / USERS_FILE
    with lock:
        try:
            stored = json.loads(path.read_text())
        except FileNotFoundError:
            return
        except ValueError:
            stored = None  # unreadable: rebuilt from the processes that join from now on
        pids = stored if isinstance(stored, list) else []
        alive = [pid for pid in pids if isinstance(pid, int) and _running(pid)]
        if alive != stored:
            path.write_text(json.dumps(alive))
            log.info("store.embedded.pruned pgdata=%s gone=%d", pgdata, len(pids) - len(alive))


def _running(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process: it exists
    return True
