"""The `parley` command: parse, open what the command needs, dispatch, report errors in one line."""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence

from core.errors import ParleyError
from core.logcontext import configure_logging
from core.settings import Settings, load_settings
from core.store import open_database
from gateway.commands import (
    agents,
    answers,
    customers,
    doctor,
    inbox,
    jobs,
    knowledge,
    search,
    secrets,
    serve,
    staff,
    telegram,
)
from gateway.runtime import Runtime, open_runtime
from gateway.worker import run_worker

log = logging.getLogger("gateway.cli")

Command = Callable[[argparse.Namespace, Runtime], Awaitable[int | None]]

# Commands that need the database, cache and embedder; the flag says whether a mismatched
# embedder must stop them (rebuild-index is how a mismatch gets fixed).
_RUNTIME_COMMANDS: dict[str, tuple[Command, bool]] = {
    "agent": (agents.run, True),
    "ingest": (knowledge.ingest, True),
    "source": (knowledge.sources, True),
    "rebuild-index": (knowledge.rebuild_index, False),
    "search": (search.run, True),
    "ask": (answers.ask, True),
    "key": (answers.key, True),
    "telegram": (telegram.run, False),
    "jobs": (jobs.run, True),
    "staff": (staff.run, False),
    "inbox": (inbox.run, False),
}


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="parley",
        description="Customer-support bot gateway: website widget, WhatsApp and Telegram, "
        "answered from your own content.",
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    serve.register(commands)
    worker = commands.add_parser("worker", help="run the background services without HTTP")
    worker.add_argument(
        "--concurrency",
        type=int,
        metavar="N",
        help="conversations answered at once, most of them waiting on the model "
        "(default PARLEY_WORKER_CONCURRENCY, 64)",
    )
    commands.add_parser("migrate", help="apply database migrations and exit")
    agents.register(commands)
    knowledge.register(commands)
    search.register(commands)
    answers.register(commands)
    telegram.register(commands)
    jobs.register(commands)
    staff.register(commands)
    inbox.register(commands)
    customers.register(commands)
    secrets.register(commands)
    doctor.register(commands)
    return parser


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
        serve.serve(args, settings)
    elif args.command == "worker":
        if args.concurrency is not None:
            settings = load_settings(worker_concurrency=args.concurrency)
        asyncio.run(run_worker(settings))
    elif args.command == "migrate":
        asyncio.run(_migrate(settings))
    elif args.command == "secrets":
        return secrets.run(args, settings)
    elif args.command == "customer":
        return asyncio.run(customers.run(args, settings))
    elif args.command == "doctor":
        return doctor.run(args, settings)
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
        status = _run(args, settings)
        sys.stdout.flush()  # here, so that a reader gone away is noticed below
        return status
    except ParleyError as exc:
        print(f"parley: error: {exc.message}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130
    except BrokenPipeError:
        return _reader_gone()


def _reader_gone() -> int:
    """`parley search ... | head`: the reader has what it wanted, so stop quietly, as a
    command killed by SIGPIPE does (status 141), without a traceback."""
    # What is still buffered would fail again when Python flushes stdout at exit.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    os.close(devnull)
    return 128 + signal.SIGPIPE


if __name__ == "__main__":
    sys.exit(main())
