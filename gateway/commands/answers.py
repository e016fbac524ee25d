"""`parley ask` (an answer in the terminal) and `parley key create` (a JSON API key)."""

from __future__ import annotations

import argparse
import sys
import uuid

from core.errors import Unavailable
from core.store import Agents
from core.store.api_keys import ApiKeys
from core.turns import TurnEvent, TurnRequest
from gateway.runtime import Runtime, open_answering


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ask = commands.add_parser("ask", help="ask an agent a question; the answer streams here")
    ask.add_argument("--agent", required=True, metavar="A")
    ask.add_argument("question")
    ask.add_argument("--lang", help="reply language (default: the question's)")
    key = commands.add_parser("key", help="API keys for the JSON API")
    actions = key.add_subparsers(dest="action", metavar="ACTION", required=True)
    create = actions.add_parser("create", help="create a key; it is shown only this once")
    create.add_argument("--agent", required=True, metavar="A")
    create.add_argument("--name", default="", help="a label for staff")


class TerminalOutput:
    """Prints tokens as they arrive, then the sources."""

    def __init__(self) -> None:
        self.failed: str | None = None

    async def emit(self, event: TurnEvent) -> None:
        if event.kind == "token":
            sys.stdout.write(str(event.data["text"]))
            sys.stdout.flush()
        elif event.kind == "sources":
            sources = list(event.data["sources"])
            print()
            if sources:
                print("\nSources:")
                for source in sources:
                    print(f"  [{source['id']}] {source['title']} - {source['url']}")
        elif event.kind == "done":
            confidence = event.data["confidence"]
            low = " (low confidence)" if event.data["low_confidence"] else ""
            print(f"\nmatch {confidence:.0%}{low}, {event.data['mode']}", file=sys.stderr)
        elif event.kind == "error":
            self.failed = str(event.data["message"])


async def ask(args: argparse.Namespace, runtime: Runtime) -> int:
    await runtime.agents.get(args.agent)
    async with open_answering(runtime) as answering:
        output = TerminalOutput()
        await answering.pipeline.run(
            TurnRequest(
                agent=args.agent,
                channel="test",
                conversation_key=f"cli-{uuid.uuid4().hex}",
                text=args.question,
                language=args.lang,
            ),
            output,
        )
        await answering.pipeline.memory.drain()
    if output.failed:
        raise Unavailable(output.failed)
    return 0


async def key(args: argparse.Namespace, runtime: Runtime) -> int:
    agent = await Agents(runtime.database.pool).get(args.agent)
    secret = await ApiKeys(runtime.database.pool).create(agent.id, args.name)
    print(f"API key for {agent.slug} (shown once; store it now):", file=sys.stderr)
    print(secret)
    return 0
