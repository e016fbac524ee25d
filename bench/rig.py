"""Child processes, readiness, CPU accounting and the run wrapper the multi-process
benchmarks share.

A benchmark of this kind starts `parley` processes (and servers of its own) beside an
embedded PostgreSQL in a temp dir, waits until they answer, measures, and must leave nothing
running behind it whatever happens: Ctrl-C, SIGTERM or an error half way.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import aiohttp
import psutil
from aiohttp import web

from core.store.embedded import EmbeddedPostgres

LOCALHOST = "127.0.0.1"


# --- child processes --------------------------------------------------------------------------


class Processes:
    """Every child process a benchmark starts, stopped in reverse order whatever happens."""

    def __init__(self) -> None:
        self._started: list[subprocess.Popen[bytes]] = []

    def start(
        self, argv: list[str], env: dict[str, str], cwd: Path, log: Path
    ) -> subprocess.Popen[bytes]:
        with log.open("wb") as out:
            # A session of its own, so Ctrl-C reaches only this process, which stops them in order.
            process = subprocess.Popen(
                argv, env=env, cwd=cwd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        self._started.append(process)
        return process

    def pids(self) -> list[int]:
        return [process.pid for process in self._started if process.poll() is None]

    def stop_all(self) -> None:
        for process in reversed(self._started):
            if process.poll() is None:
                process.terminate()
        for process in reversed(self._started):
            try:
                process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(10)
        self._started.clear()


def free_port() -> int:
    """A port nothing listens on now, for a server started next."""
    with socket.socket() as sock:
        sock.bind((LOCALHOST, 0))
        return int(sock.getsockname()[1])


def tail(log: Path, lines: int = 30) -> str:
    """The end of a child's log, to say why it failed."""
    try:
        return "\n".join(log.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


async def wait_ready(base: str, process: subprocess.Popen[bytes], name: str, log: Path) -> None:
    """Until ``base``/readyz answers 200; raises with the log's end if the process exits or
    two minutes pass first."""
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as session:
        for _ in range(600):
            if process.poll() is not None:
                raise RuntimeError(f"{name} exited with {process.returncode}:\n{tail(log)}")
            with contextlib.suppress(aiohttp.ClientError, OSError, TimeoutError):
                async with session.get(f"{base}/readyz") as response:
                    if response.status == 200:
                        return
            await asyncio.sleep(0.2)
    raise RuntimeError(f"{name} was not ready within two minutes:\n{tail(log)}")


# --- CPU accounting ---------------------------------------------------------------------------


def cpu_seconds(process: psutil.Process) -> float:
    """CPU time a process has used so far (user and system); 0 for one that has ended, whose
    time can no longer be read."""
    try:
        times = process.cpu_times()
    except psutil.Error:
        return 0.0
    return float(times.user + times.system)


def with_children(pid: int) -> list[psutil.Process]:
    """A process and all its descendants now; none if it has ended."""
    with contextlib.suppress(psutil.Error):
        parent = psutil.Process(pid)
        return [parent, *parent.children(recursive=True)]
    return []


def postgres_processes(data_dir: Path) -> list[psutil.Process]:
    """The embedded PostgreSQL of ``data_dir``: its server, found by the data folder on its
    command line, and the backends and helpers it started (whose command lines do not say)."""
    found = []
    for process in psutil.process_iter(["name", "cmdline"]):
        cmdline = " ".join(process.info["cmdline"] or ())
        if process.info["name"] == "postgres" and str(data_dir) in cmdline:
            found += with_children(process.pid)
    return found


class CpuMeter:
    """CPU seconds used since it was made, per named group: each group is read by a function
    giving the CPU seconds its processes have used so far."""

    def __init__(self, groups: dict[str, Callable[[], float]]) -> None:
        self._groups = groups
        self._start = self._now()

    def used(self) -> dict[str, float]:
        now = self._now()
        return {name: now[name] - self._start[name] for name in now}

    def _now(self) -> dict[str, float]:
        return {name: read() for name, read in self._groups.items()}


def tree_cpu(pids: list[int]) -> Callable[[], float]:
    """A CPU group: the processes ``pids`` with their children as they are at each reading."""
    return lambda: sum(cpu_seconds(p) for pid in pids for p in with_children(pid))


def postgres_cpu(data_dir: Path) -> Callable[[], float]:
    """A CPU group: the embedded PostgreSQL of ``data_dir``, backends included."""
    return lambda: sum(map(cpu_seconds, postgres_processes(data_dir)))


def own_cpu() -> float:
    """This process's CPU seconds: the load generator and the fakes it serves."""
    return cpu_seconds(psutil.Process())


# --- the run wrapper --------------------------------------------------------------------------


@runtime_checkable
class Closable(Protocol):
    async def close(self) -> None: ...


async def release_all(resources: list[Any]) -> None:
    """Let go of what a run held, last first: servers of this process, client sessions,
    pools; a failure to let go of one does not keep the others held."""
    for resource in reversed(resources):
        with contextlib.suppress(Exception):
            if isinstance(resource, web.AppRunner):
                await resource.cleanup()
            elif isinstance(resource, Closable):
                await resource.close()


async def start_postgres(data_dir: Path, release: list[Any]) -> str:
    """The embedded PostgreSQL of ``data_dir`` started, its URL; held in ``release`` so that
    `run_benchmark` stops it last, after the children that use it."""
    postgres = EmbeddedPostgres(data_dir)
    release.append(postgres)
    return await postgres.start()


def stop_postgres(postgres: EmbeddedPostgres) -> None:
    """Let go of the embedded server; if a killed child left its claim on it, stop it by pid."""
    asyncio.run(postgres.stop())
    pid_file = postgres.pgdata / "postmaster.pid"
    with contextlib.suppress(OSError, ValueError, IndexError):
        pid = int(pid_file.read_text().splitlines()[0])
        command = Path(f"/proc/{pid}/cmdline").read_bytes()
        if str(postgres.pgdata).encode() not in command:
            return  # a stale file: that pid is not our server any more
        os.kill(pid, signal.SIGINT)  # PostgreSQL's fast shutdown
        for _ in range(100):
            os.kill(pid, 0)
            time.sleep(0.1)


# What a benchmark's run does inside the rig: the arguments, the temp dir, the children it
# starts and what to let go of at the end (servers, sessions, pools, the embedded PostgreSQL).
Run = Callable[[argparse.Namespace, Path, Processes, list[Any]], Awaitable[int]]


def run_benchmark(name: str, run: Run, args: argparse.Namespace) -> int:
    """``run`` in a fresh temp dir; then, however it ended, its children stopped, what it held
    let go of and the embedded PostgreSQL stopped. 130 when interrupted (Ctrl-C, SIGTERM)."""
    processes = Processes()
    release: list[Any] = []
    with tempfile.TemporaryDirectory(prefix=f"parley-bench-{name}-") as folder:
        tmp = Path(folder)
        tmp.chmod(0o755)  # the embedded server may run as another user (when we are root)

        async def session() -> int:
            # SIGTERM ends the run like Ctrl-C: through the finally below.
            this = asyncio.current_task()
            assert this is not None
            asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, this.cancel)
            try:
                return await run(args, tmp, processes, release)
            finally:
                # In a thread: the fakes in this loop keep answering the children as they drain.
                await asyncio.to_thread(processes.stop_all)
                await release_all([r for r in release if not isinstance(r, EmbeddedPostgres)])

        try:
            return asyncio.run(session())
        except (KeyboardInterrupt, asyncio.CancelledError):
            print("\ninterrupted", file=sys.stderr)
            return 130
        finally:
            processes.stop_all()
            for postgres in (r for r in release if isinstance(r, EmbeddedPostgres)):
                stop_postgres(postgres)
