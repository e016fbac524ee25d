"""Outages of Redis, the model and the providers at the issue's load levels: is anything lost?

    .venv/bin/python -m bench.faults                                  # every scenario
    .venv/bin/python -m bench.faults --scenario redis --scenario burst --seconds 10

The same scenarios as tests/integration/test_faults.py (tests/support/faults.py), longer and
on production's settings: the holding message after 30 s, Twilio's send timeout 15 s, the
burst window (1 s), back-off from a second doubling up to two minutes, inbox leases of a minute
(a killed worker's messages wait for theirs to run out). `parley serve --no-workers` and
`parley worker` run as processes of their own on an embedded PostgreSQL in a temporary folder
and a redis-server of their own; the fake model, Twilio and Telegram run in this process and
fail on command. Every message comes from a customer of its own; each scenario ends when the
inbox and the outbox have nothing left to do, and counts per customer what the fake providers
received: the answer once, never (lost) or more than once (doubled), the holding message.
Waits run from the webhook to the answer reaching the fake provider.

`--seconds` sets each chosen scenario's seconds of webhook load (its fault scales with it);
the widget scenario asks its 12 questions whatever it says.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from core.store.embedded import EmbeddedPostgres
from tests.support.faults import (
    Rig,
    Tally,
    WidgetTally,
    burst,
    model_outage,
    provider_answers_late,
    redis_outage,
    widget_during_redis_outage,
    worker_killed,
)
from tests.support.services import RedisServer

SETTLE = 900.0  # seconds a scenario may take to answer everything after its load
Outcome = Tally | WidgetTally


@dataclass(frozen=True)
class Scenario:
    name: str
    seconds: float  # of webhook load, by default: the issue's
    what: str
    run: Callable[[Rig, float], Coroutine[Any, Any, Outcome]]


SCENARIOS = [
    Scenario(
        "redis", 60, "4 webhooks/s; Redis SIGKILLed for 25/60 of the load, back empty",
        lambda rig, s: redis_outage(
            rig, rate=4, outage=s * 25 / 60, margin=s * 17.5 / 60, settle=SETTLE
        ),
    ),
    Scenario(
        "widget", 0, "12 widget chats, one after the other, while Redis is down",
        lambda rig, s: widget_during_redis_outage(rig, chats=12),
    ),
    Scenario(
        "model-500", 30, "a message every 5 s; the model answers HTTP 500 until 10 s after",
        lambda rig, s: model_outage(
            rig, failure="status 500", rate=0.2, load=s, outage=s + 10, settle=SETTLE
        ),
    ),
    Scenario(
        "model-hang", 8, "a message every 2 s; the model hangs until 22 s after",
        lambda rig, s: model_outage(
            rig, failure="hang", rate=0.5, load=s, outage=s + 22, settle=SETTLE
        ),
    ),
    Scenario(
        "model-down", 20, "1 message/s; the model refuses connections for the middle half",
        lambda rig, s: model_outage(
            rig, failure="refused", rate=1, load=s, start=s / 4, outage=s / 2, settle=SETTLE
        ),
    ),
    Scenario(
        "provider-late", 4, "1 WhatsApp message/s; Twilio accepts each reply, answers after 20 s",
        lambda rig, s: provider_answers_late(
            rig, messages=max(1, round(s)), late_by=20, rate=1, settle=SETTLE
        ),
    ),
    Scenario(
        "burst", 20, "30 webhooks/s, the model takes 1 s, nothing fails",
        lambda rig, s: burst(rig, rate=30, seconds=s, model_seconds=1.0, settle=SETTLE),
    ),
    Scenario(
        "worker-kill", 30, "10 WhatsApp webhooks/s, 0.5 s model; `parley worker` SIGKILLed 3x "
        "mid-turn and mid-send, restarted at once",
        lambda rig, s: worker_killed(
            rig, rate=10, seconds=s, kills=3, model_seconds=0.5, wait_for_leases=True,
            settle=SETTLE,
        ),
    ),
]  # fmt: skip
BY_NAME = {s.name: s for s in SCENARIOS}


def _row(outcome: Outcome, seconds: float) -> tuple[str, ...]:
    if isinstance(outcome, WidgetTally):
        # A chat has no acknowledgement of its own; its wait is the whole answer's.
        took = sorted(outcome.seconds)
        median = f"{took[len(took) // 2]:.1f}" if took else "-"
        slowest = f"{took[-1]:.1f}" if took else "-"
        return (
            outcome.scenario, "-", f"{outcome.answered} of {outcome.chats}",
            str(outcome.chats - outcome.answered), "-", "-", median, slowest, f"{seconds:.0f}",
        )  # fmt: skip
    return (
        outcome.scenario, str(outcome.acknowledged), str(outcome.answered_once),
        str(outcome.lost), str(outcome.doubled), str(outcome.held),
        f"{outcome.wait(50):.1f}", f"{outcome.wait(99):.1f}", f"{seconds:.0f}",
    )  # fmt: skip


def _print_table(rows: list[tuple[str, ...]]) -> None:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for number, row in enumerate(rows):
        cells = [row[0].ljust(widths[0])]
        cells += [cell.rjust(w) for cell, w in zip(row[1:], widths[1:], strict=True)]
        print("  ".join(cells))
        if number == 0:
            print("  ".join("-" * w for w in widths))


def run(args: argparse.Namespace, tmp: Path) -> int:
    chosen = [BY_NAME[name] for name in args.scenario] if args.scenario else SCENARIOS
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    print(
        f"machine: {cores} cores, {platform.machine()}, Python {platform.python_version()}; "
        "settings: production defaults",
        flush=True,
    )
    postgres = EmbeddedPostgres(tmp / "postgres-data")
    database_url = asyncio.run(postgres.start())
    redis = RedisServer(tmp)
    rows: list[tuple[str, ...]] = [
        ("scenario", "acknowledged", "answered once", "lost", "doubled", "held",
         "wait p50 s", "p99 s", "run s"),
    ]  # fmt: skip
    clean = True
    try:
        with Rig(tmp, database_url, redis) as rig:
            for scenario in chosen:
                seconds = args.seconds if args.seconds is not None else scenario.seconds
                print(f"\n{scenario.name}: {scenario.what} ({seconds:g} s of load)", flush=True)
                started = time.monotonic()
                outcome = rig.run(scenario.run(rig, seconds))
                took = time.monotonic() - started
                print(outcome.describe(), flush=True)
                rows.append(_row(outcome, took))
                clean &= outcome.clean
    finally:
        redis.stop()
        asyncio.run(postgres.stop())
    print()
    _print_table(rows)
    print(
        "\nheld: customers told once that the answer is delayed; waits from the webhook to "
        "the answer at the provider; run: seconds the scenario took, load and settling"
    )
    return 0 if clean else 1


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--scenario",
        action="append",
        choices=list(BY_NAME),
        help="run this scenario (repeat for several; default: all, in this order: "
        + ", ".join(BY_NAME)
        + ")",
    )
    parser.add_argument(
        "--seconds",
        type=float,
        default=None,
        help="seconds of webhook load per scenario (default: each scenario's own, the issue's)",
    )
    args = parser.parse_args()
    if args.seconds is not None and not 1 <= args.seconds <= 600:
        parser.error("--seconds must be 1-600")
    with tempfile.TemporaryDirectory(prefix="parley-bench-faults-") as name:
        tmp = Path(name)
        tmp.chmod(0o755)  # the embedded server may run as another user (when we are root)
        try:
            return run(args, tmp)
        except KeyboardInterrupt:
            print("\ninterrupted", file=sys.stderr)
            return 130


if __name__ == "__main__":
    sys.exit(main())
