"""`parley agent create|list|show|update`."""

from __future__ import annotations

import argparse
import json
from typing import Any

from channels.registry import secret_fields
from core.errors import InvalidInput
from core.keyring import Keyring
from core.llm.limits import (
    CONCURRENCY_SETTING,
    DEFAULT_LLM_CONCURRENCY,
    RATE_SETTING,
    validate_llm_limits,
)
from core.store import Agent, Agents
from core.store.vector_index import EmbedderIdentity
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
    update = actions.add_parser("update", help="change an agent's settings")
    update.add_argument("name", metavar="NAME")
    update.add_argument(
        "--allowed-origin",
        action="append",
        metavar="URL",
        help="a website allowed to embed the widget (repeat; replaces the list)",
    )
    update.add_argument("--threshold", type=float, help="confidence threshold, 0-1")
    update.add_argument("--contact", help="contact route given when an answer can't be verified")
    update.add_argument("--persona", help="who the assistant is, in a sentence or two")
    update.add_argument("--language", help="default reply language")
    update.add_argument("--timezone", help="IANA time zone")
    for scope in ("session", "ip"):
        update.add_argument(
            f"--rate-limit-{scope}",
            metavar="RATE/BURST",
            help=f"widget messages per second and burst per {scope}, e.g. 0.2/5",
        )
    update.add_argument(
        "--llm-concurrency",
        type=int,
        metavar="N",
        help=f"answers the model writes at once for this agent, per process "
        f"(default {DEFAULT_LLM_CONCURRENCY}; 0: back to the default)",
    )
    update.add_argument(
        "--llm-requests-per-minute",
        type=float,
        metavar="N",
        help="answers started per minute for this agent, per process (default: no limit; "
        "0: no limit)",
    )


def _rate(value: str) -> list[float]:
    rate, _, burst = value.partition("/")
    try:
        parsed = [float(rate), float(burst)]
    except ValueError:
        raise InvalidInput(
            f"rate limit {value!r} must look like 0.2/5 (per second / burst)"
        ) from None
    if parsed[0] <= 0 or parsed[1] < 1:
        raise InvalidInput(f"rate limit {value!r}: the rate must be > 0 and the burst >= 1")
    return parsed


def _changes(args: argparse.Namespace, agent: Agent) -> dict[str, Any]:
    changes: dict[str, Any] = {}
    if args.allowed_origin is not None:
        changes["allowed_origins"] = args.allowed_origin
    if args.threshold is not None:
        changes["confidence_threshold"] = args.threshold
    for option, column in (
        ("contact", "contact_route"),
        ("persona", "persona"),
        ("language", "default_language"),
        ("timezone", "timezone"),
    ):
        if getattr(args, option) is not None:
            changes[column] = getattr(args, option)
    limits = dict(agent.settings.get("rate_limits") or {})
    for scope in ("session", "ip"):
        value = getattr(args, f"rate_limit_{scope}")
        if value is not None:
            limits[scope] = _rate(value)
    settings = dict(agent.settings)
    if limits != (agent.settings.get("rate_limits") or {}):
        settings["rate_limits"] = limits
    for option, key in (
        ("llm_concurrency", CONCURRENCY_SETTING),
        ("llm_requests_per_minute", RATE_SETTING),
    ):
        value = getattr(args, option)
        if value == 0:
            settings.pop(key, None)
        elif value is not None:
            settings[key] = int(value) if float(value).is_integer() else value
    validate_llm_limits(settings)
    if settings != agent.settings:
        changes["settings"] = settings
    if not changes:
        raise InvalidInput("nothing to change: give at least one option")
    return changes


def _table(rows: dict[str, object]) -> None:
    width = max(len(k) for k in rows)
    for key, value in rows.items():
        print(f"{key.ljust(width)}  {value}")


async def run(args: argparse.Namespace, runtime: Runtime) -> None:
    agents = Agents(
        runtime.database.pool,
        keyring=Keyring.from_settings(runtime.settings),
        secret_fields=secret_fields(),
    )
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
    elif args.action == "update":
        agent = await agents.update(args.name, **_changes(args, await agents.get(args.name)))
        print(f"updated agent {agent.slug}")
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
