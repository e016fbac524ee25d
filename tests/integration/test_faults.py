"""Nothing acknowledged is lost or doubled: each row of the fault table against real processes.

`parley serve --no-workers` and `parley worker` run as subprocesses on this module's own
database and Redis server; the model, Twilio and Telegram are local fakes that fail on
command (tests/support/faults.py). Each test puts a few seconds of webhook load through one
fault, waits until the inbox and the outbox have nothing left to do, and counts per customer:
acknowledged, answered exactly once, lost, doubled, told to hold on at most once.

The processes are shared by the module's tests (each scenario heals every fault first and
uses customers of its own), with settings made small so that faults pass in seconds: the
holding message after 2 s, Twilio's send timeout 1 s, no burst window. bench/faults.py runs
the same scenarios at the issue's load levels, on production's settings.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.faults import (
    Process,
    Rig,
    burst,
    model_outage,
    provider_answers_late,
    redis_outage,
    widget_during_redis_outage,
    worker_killed,
)
from tests.support.services import RedisServer, database_from_template

SETTINGS = {
    "PARLEY_BURST_WINDOW_SECONDS": "0",
    "PARLEY_HOLDING_MESSAGE_SECONDS": "2",
    "PARLEY_TWILIO_SEND_TIMEOUT_SECONDS": "1",
}


@pytest.fixture(scope="module")
def rig(
    postgres_url: str, template_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Rig]:
    workdir = tmp_path_factory.mktemp("faults")
    redis = RedisServer(workdir)
    try:
        with (
            database_from_template(postgres_url, template_database, "t_faults_") as database,
            Rig(workdir, database, redis, SETTINGS) as running,
        ):
            yield running
    finally:
        redis.stop()


def test_redis_killed_then_back_empty(rig: Rig) -> None:
    worker = _worker(rig)
    gone, back = worker.said("cache.unavailable"), worker.said("cache.available")
    result = rig.run(redis_outage(rig, rate=4, outage=3, margin=1, settle=30), timeout=90)
    assert result.clean, result.describe()
    assert result.sent == 20
    # The outage was real: the worker answered without Redis, then used it again.
    assert worker.said("cache.unavailable") > gone, worker.tail()
    assert worker.said("cache.available") > back, worker.tail()


def test_widget_chat_while_redis_is_down_is_answered(rig: Rig) -> None:
    assert rig.gateway is not None
    gone = rig.gateway.said("cache.unavailable")
    result = rig.run(widget_during_redis_outage(rig, chats=12), timeout=90)
    assert result.clean, result.describe()
    assert rig.gateway.said("cache.unavailable") > gone, rig.gateway.tail()


def test_a_model_answering_500_for_a_while_loses_nothing(rig: Rig) -> None:
    refused = _chats_not_answered(rig)
    result = rig.run(
        model_outage(rig, failure="status 500", rate=2, load=3, outage=4, settle=40), timeout=90
    )
    assert result.clean, result.describe()
    assert _chats_not_answered(rig) > refused  # the model did fail those turns
    assert result.held > 0  # customers kept waiting were told, once


def test_a_hanging_model_loses_nothing(rig: Rig) -> None:
    # The hung requests end at the client's first-token timeout (20 s); then the turns are
    # tried again and answered.
    disconnects = rig.model.disconnects
    result = rig.run(
        model_outage(rig, failure="hang", rate=2, load=2, outage=3, settle=60), timeout=90
    )
    assert result.clean, result.describe()
    assert rig.model.disconnects > disconnects  # Parley gave up on the hung requests
    assert result.held > 0


def test_a_model_that_is_down_loses_nothing(rig: Rig) -> None:
    failed = _worker(rig).said("inbox.turn.failed")
    result = rig.run(
        model_outage(rig, failure="refused", rate=2, load=5, start=1, outage=3, settle=40),
        timeout=90,
    )
    assert result.clean, result.describe()
    assert _worker(rig).said("inbox.turn.failed") > failed  # turns did fail, and were retried


def test_a_provider_answering_after_the_timeout_gets_no_second_copy(rig: Rig) -> None:
    adopted = _worker(rig).said("outbox.send.adopted")
    result = rig.run(provider_answers_late(rig, messages=4, late_by=3, rate=2, settle=40), 90)
    assert result.clean, result.describe()
    # Each reply timed out, and a look-up found it at Twilio instead of sending it again.
    assert _worker(rig).said("outbox.send.adopted") - adopted == 4


def test_a_burst_with_a_slow_model_is_answered_once_each(rig: Rig) -> None:
    result = rig.run(burst(rig, rate=30, seconds=1.5, model_seconds=1.0, settle=60), timeout=90)
    assert result.clean, result.describe()
    assert result.sent == 45


def test_a_worker_killed_mid_turn_and_mid_send_loses_and_doubles_nothing(rig: Rig) -> None:
    adopted = _worker(rig).said("outbox.send.adopted")
    result = rig.run(
        worker_killed(
            rig, rate=5, seconds=3, kills=1, model_seconds=0.5, wait_for_leases=False, settle=60
        ),
        timeout=110,
    )
    assert result.clean, result.describe()
    # Killed while it held messages it was answering and a reply it was sending.
    [(inbox, outbox)] = result.facts["held by the killed worker (inbox, outbox)"]
    assert inbox > 0, result.describe()
    assert outbox > 0, result.describe()
    # The reply Twilio had accepted when the worker died was found by a look-up, not resent.
    assert _worker(rig).said("outbox.send.adopted") > adopted


def _worker(rig: Rig) -> Process:
    assert rig.worker is not None
    return rig.worker


def _chats_not_answered(rig: Rig) -> int:
    """Chat requests of turns the fake model streamed no answer to (errors, hangs) so far;
    topic requests are never streamed, and not counted."""
    return len(rig.model.turn_requests) - rig.model.streams_started
