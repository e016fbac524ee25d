"""`parley customer erase|export`: one customer's data erased, or printed as JSON."""

from __future__ import annotations

import argparse
import getpass
import json
from dataclasses import asdict
from datetime import UTC, datetime

import asyncpg

from channels.registry import channel_names
from core.cache import open_cache
from core.memory import build_memory
from core.ports import Cache
from core.privacy import CustomerData
from core.settings import Settings
from core.store import open_database
from core.store.agents import Agents
from core.store.privacy import Customer, Privacy
from gateway.admin.schemas import CustomerExportOut, ExportedConversationOut


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    customer = commands.add_parser(
        "customer", help="a customer's data: export it, or erase it (privacy requests)"
    )
    actions = customer.add_subparsers(dest="action", metavar="ACTION", required=True)
    for name, text in (
        (
            "erase",
            "delete the customer's conversations, messages, summaries, traces, content gaps, "
            "feedback, inbox and outbox rows and cached memory; the audit log keeps a keyed "
            "hash of the id and the counts",
        ),
        ("export", "print the customer's conversations as JSON"),
    ):
        action = actions.add_parser(name, help=text, description=text)
        action.add_argument("--agent", required=True, metavar="A", help="the agent's slug")
        action.add_argument("--channel", required=True, choices=channel_names(), metavar="C")
        action.add_argument(
            "--id",
            required=True,
            dest="customer",
            metavar="ID",
            help="the channel's own id of the customer: whatsapp:+316..., a Telegram chat id, "
            "a widget session id",
        )
    actions.choices["export"].add_argument(
        "--traces", action="store_true", help="also each turn's trace (what was searched)"
    )


def _who() -> str:
    # The audit names who asked: here the account running the command.
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):
        return "cli"


async def run(args: argparse.Namespace, settings: Settings) -> int:
    # The database and the cache only: no embedder to load for a privacy request.
    database = await open_database(settings, max_size=2)
    cache = await open_cache(settings)
    try:
        await _run(args, database.pool, settings, cache)
    finally:
        await cache.close()
        await database.close()
    return 0


async def _run(
    args: argparse.Namespace, pool: asyncpg.Pool, settings: Settings, cache: Cache
) -> None:
    agent = await Agents(pool).get(args.agent)
    # The memory is forgotten in the cache this process shares with the gateway (Redis).
    customers = CustomerData(Privacy(pool), build_memory(settings, pool, cache, None))
    customer = Customer(agent.id, agent.slug, args.channel, args.customer)
    if args.action == "erase":
        erasure = await customers.erase(customer, staff=_who())
        counts = asdict(erasure.erased)
        if erasure.erased.total == 0:
            print(f"nothing of that customer on {args.channel} for agent {agent.slug}")
        else:
            removed = ", ".join(f"{n} {kind.replace('_', ' ')}" for kind, n in counts.items())
            print(f"erased: {removed}")
        print(f"audit: customer {erasure.customer_hash[:12]} (keyed hash)")
        return
    conversations = await customers.export(customer, staff=_who(), traces=args.traces)
    exported = CustomerExportOut(
        agent=agent.slug,
        channel=args.channel,
        customer=args.customer,
        exported_at=datetime.now(UTC),
        conversations=[ExportedConversationOut.model_validate(c) for c in conversations],
    )
    print(json.dumps(exported.model_dump(mode="json"), ensure_ascii=False, indent=2))
