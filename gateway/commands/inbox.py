"""`parley inbox list|retry`: WhatsApp and Telegram messages that failed or wait too long."""

from __future__ import annotations

import argparse
import json

from core.store.agents import Agents
from core.store.inbox import Inbox, TroubledRow
from gateway.runtime import Runtime


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    inbox = commands.add_parser(
        "inbox", help="messages whose answer failed or is late; take them up again"
    )
    actions = inbox.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="failed messages, and those waiting too long")
    listing.add_argument("--agent", metavar="A", help="only this agent's")
    shown = listing.add_mutually_exclusive_group()
    shown.add_argument("--failed", action="store_true", help="only failed ones")
    shown.add_argument("--stuck", action="store_true", help="only those still waiting")
    listing.add_argument("--json", action="store_true", help="one JSON object per line")
    retry = actions.add_parser(
        "retry",
        help="answer failed messages (and those waiting to be tried again) now: all, or the "
        "IDs given",
    )
    retry.add_argument("ids", nargs="*", type=int, metavar="ID", help="inbox ids (from list)")
    retry.add_argument("--agent", metavar="A", help="only this agent's")


def _line(row: TroubledRow) -> dict[str, object]:
    return {
        "id": row.id,
        "status": row.status,
        "agent": row.agent,
        "channel": row.channel,
        "customer": row.conversation_key,
        "received_at": row.received_at.isoformat(timespec="seconds"),
        "attempts": row.attempts,
        "next_attempt_at": row.next_attempt_at.isoformat(timespec="seconds")
        if row.status == "pending"
        else None,
        "error": row.error,
    }


async def _list(args: argparse.Namespace, runtime: Runtime, agent_id: int | None) -> None:
    rows = await Inbox(runtime.database.pool).troubled(
        stuck_after=runtime.settings.inbox_stuck_after,
        failed=not args.stuck,
        stuck=not args.failed,
        agent_id=agent_id,
        limit=1000,
    )
    if args.json:
        for row in rows:
            print(json.dumps(_line(row)))
        return
    if not rows:
        print("no failed or late messages")
        return
    for row in rows:
        line = _line(row)
        print(
            f"{line['id']}\t{line['status']}\t{line['agent']}\t{line['channel']}\t"
            f"{line['customer']}\t{line['received_at']}\t{line['attempts']} attempts\t"
            f"{line['error'] or ''}".rstrip()
        )


async def run(args: argparse.Namespace, runtime: Runtime) -> None:
    pool = runtime.database.pool
    agent_id = (await Agents(pool).get(args.agent)).id if args.agent else None
    if args.action == "list":
        await _list(args, runtime, agent_id)
        return
    count = await Inbox(pool).retry(args.ids or None, agent_id=agent_id)
    if count == 0:
        print("no failed messages to take up again")
        return
    noun = "message" if count == 1 else "messages"
    print(f"took up {count} {noun} again; the workers answer them shortly")
