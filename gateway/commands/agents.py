"""`parley agent create|list|show`."""

from __future__ import annotations

import argparse
import json

from core.retrieval.embedders import EmbedderIdentity
from core.store import Agents
from gateway.runtime import Runtime


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    agent = commands.add_parser("agent", help="create, list and show agents")
    actions = agent.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create an agent and print its widget key")
    create.add_argument("name", metavar="NAME", help="short name used in URLs, e.g. 'shop'")
    create.add_argument("--display-name", help="name shown to staff (default: NAME)")
    create.add_argument("--language", default="en", help="default reply language (default: en)")
    create.add_argument("--timezone", default="UTC", help="IANA time zone (default: UTC)")
    listing = actions.add_parser("list", help="list agents")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    show = actions.add_parser("show", help="show one agent")
    show.add_argument("name", metavar="NAME")


def _table(rows: dict[str, object]) -> None:
    width = max(len(k) for k in rows)
    for key, value in rows.items():
        print(f"{key.ljust(width)}  {value}")


async def run(args: argparse.Namespace, runtime: Runtime) -> None:
    agents = Agents(runtime.database.pool)
    if args.action == "create":
        agent = await agents.create(
            args.name,
            embedder=EmbedderIdentity.of(runtime.embedder),
            name=args.display_name,
            language=args.language,
            timezone=args.timezone,
        )
        print(f"created agent {agent.slug}")
        _table({"language": agent.default_language, "timezone": agent.timezone})
        print(f"widget key  {agent.widget_key}")
    elif args.action == "list":
        for agent in await agents.list():
            if args.json:
                row = {
                    "name": agent.slug,
                    "display_name": agent.name,
                    "language": agent.default_language,
                    "timezone": agent.timezone,
                    "widget_key": agent.widget_key,
                    "knowledge_version": agent.knowledge_version,
                }
                print(json.dumps(row))
            else:
                print(f"{agent.slug}\t{agent.default_language}\t{agent.timezone}\t{agent.name}")
    else:
        agent = await agents.get(args.name)
        _table(
            {
                "name": agent.slug,
                "display name": agent.name,
                "language": agent.default_language,
                "timezone": agent.timezone,
                "widget key": agent.widget_key,
                "allowed origins": ", ".join(agent.allowed_origins) or "(none)",
                "embedder": f"{agent.embedder} ({agent.embedding_dim} dimensions)",
                "knowledge version": agent.knowledge_version,
            }
        )
