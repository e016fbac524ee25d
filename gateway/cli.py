"""The `parley` command: parse, open what the command needs, dispatch, report errors in one line."""

from __future__ import annotations

import argparse
import asyncio
import errno
import logging
import socket
import sys
from collections.abc import Awaitable, Callable, Sequence

from aiohttp import web

from core.errors import ConfigError, ParleyError
from core.logcontext import configure_logging
from core.settings import Settings, load_settings
from core.store import open_database
from gateway.access_log import AccessLogger
from gateway.app import create_app
from gateway.commands import agents, knowledge, search
from gateway.runtime import Runtime, open_runtime
from gateway.worker import run_worker

log = logging.getLogger("gateway.cli")

# Seconds in-flight requests get to finish after SIGTERM.
SHUTDOWN_GRACE = 15.0

Command = Callable[[argparse.Namespace, Runtime], Awaitable[int | None]]

# Commands that need the database, cache and embedder; the flag says whether a mismatched
# embedder must stop them (rebuild-index is how a mismatch gets fixed).
_RUNTIME_COMMANDS: dict[str, tuple[Command, bool]] = {
    "agent": (agents.run, True),
    "ingest": (knowledge.ingest, True),
    "source": (knowledge.sources, True),
    "rebuild-index": (knowledge.rebuild_index, False),
    "search": (search.run, True),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parley",
        description="Customer-support bot gateway: website widget, WhatsApp and Telegram, "
        "answered from your own content.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    commands.add_parser("serve", help="run the gateway (HTTP, workers and scheduler)")
    commands.add_parser("worker", help="run the background services without HTTP")
    commands.add_parser("migrate", help="apply database migrations and exit")
    agents.register(commands)
    knowledge.register(commands)
    search.register(commands)
    return parser


def _listen(host: str, port: int) -> socket.socket:
    """Bind the listening socket before anything starts, so a busy port fails fast."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, port, type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE
        )[0]
    except socket.gaierror:
        raise ConfigError(f"cannot resolve PARLEY_HOST {host!r}") from None
    sock = socket.socket(family, kind, proto)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(address)
        sock.listen(512)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise ConfigError(
                f"port {port} on {host} is already in use; "
                "stop the other process or set PARLEY_PORT"
            ) from None
        raise ConfigError(f"cannot listen on {host}:{port}: {exc.strerror}") from None
    return sock


def _serve(settings: Settings) -> None:
    sock = _listen(settings.host, settings.port)
    web.run_app(
        create_app(settings),
        sock=sock,
        print=None,
        shutdown_timeout=SHUTDOWN_GRACE,
        access_log_class=AccessLogger,
    )
    log.info("gateway.stopped")


async def _migrate(settings: Settings) -> None:
    database = await open_database(settings, max_size=1)
    try:
        version = await database.pool.fetchval("SELECT max(version) FROM schema_migrations")
        print(f"database is at migration {version:04d} ({database.description})")
    finally:
        await database.close()


async def _with_runtime(args: argparse.Namespace, settings: Settings) -> int:
    command, check_index = _RUNTIME_COMMANDS[args.command]
    async with open_runtime(settings, check_index=check_index) as runtime:
        return await command(args, runtime) or 0


def _run(args: argparse.Namespace, settings: Settings) -> int:
    if args.command == "serve":
        _serve(settings)
    elif args.command == "worker":
        asyncio.run(run_worker(settings))
    elif args.command == "migrate":
        asyncio.run(_migrate(settings))
    else:
        return asyncio.run(_with_runtime(args, settings))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        settings = load_settings()
        # One-shot commands print their result; their progress logs only when asked for.
        long_running = args.command in ("serve", "worker")
        quiet = not long_running and "log_level" not in settings.model_fields_set
        configure_logging("WARNING" if quiet else settings.log_level)
        return _run(args, settings)
    except ParleyError as exc:
        print(f"parley: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
