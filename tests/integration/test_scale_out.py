"""Scaled out: two gateways behind a round-robin proxy and two workers share the work.

`parley serve --no-workers` twice and `parley worker` twice run as subprocesses on this
module's own database and Redis server (`tests.support.cluster`); Twilio, Telegram and the
model are local fakes. Signed Twilio webhooks and Telegram updates, each from a customer of
its own, go through the proxy; per customer, what reached the fake providers is counted.

That scheduled jobs run once per slot across processes is tested with two worker processes in
tests/integration/test_jobs.py (`test_two_worker_processes_run_each_slot_once`).
"""

from __future__ import annotations

import asyncio
import signal
import subprocess
from collections.abc import Iterator

import pytest

from tests.support.cluster import Cluster
from tests.support.faults import Message
from tests.support.services import RedisServer, database_from_template

SETTINGS = {"PARLEY_BURST_WINDOW_SECONDS": "0"}


@pytest.fixture(scope="module")
def cluster(
    postgres_url: str, template_database: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Cluster]:
    workdir = tmp_path_factory.mktemp("scale-out")
    redis = RedisServer(workdir)
    try:
        with (
            database_from_template(postgres_url, template_database, "t_scale_") as database,
            Cluster(workdir, database, redis, SETTINGS, gateways=2, workers=2) as running,
        ):
            yield running
    finally:
        redis.stop()


def test_two_gateways_and_two_workers_answer_every_message_once(cluster: Cluster) -> None:
    messages = cluster.run(cluster.load(rate=20, seconds=4), timeout=60)
    result = cluster.run(cluster.tally("2 gateways, 2 workers", messages, timeout=60), timeout=90)

    assert result.clean, result.describe()
    assert {m.channel for m in messages} == {"whatsapp", "telegram"}
    # Both gateways acknowledged webhooks, and both workers answered some of them.
    for gateway in cluster.gateways:
        assert gateway.said("path=/webhooks/") > 0, gateway.tail()
    assert len(cluster.proxy.served) == 2
    answered = [worker.said("inbox.turn.answered") for worker in cluster.workers]
    assert all(answered), answered
    assert sum(answered) == len(messages)  # one turn per customer: none answered twice


def test_a_worker_stopped_under_load_finishes_its_turns_and_loses_nothing(
    cluster: Cluster,
) -> None:
    stopped, other = cluster.workers
    cluster.model.first_token_delay = 1.0  # turns in flight when the worker is told to stop

    async def load_and_stop() -> list[Message]:
        sending = asyncio.create_task(cluster.load(rate=10, seconds=4))
        while not (await cluster.held_rows())[0]:
            await asyncio.sleep(0.05)
        await asyncio.sleep(1.5)  # both workers are answering by now
        stopped.popen.send_signal(signal.SIGTERM)
        return await sending

    try:
        messages = cluster.run(load_and_stop(), timeout=60)
        result = cluster.run(cluster.tally("a worker stopped", messages, timeout=60), timeout=90)
    finally:
        cluster.model.first_token_delay = 0.0
    try:
        status = stopped.popen.wait(60)
    except subprocess.TimeoutExpired:
        stopped.kill()
        raise

    assert result.clean, result.describe()
    # Nothing the stopped worker held waited for its lease to run out: no customer was told to
    # hold on, and every reply went out at its first attempt.
    assert result.held == 0, result.describe()
    assert cluster.run(cluster.outbox_attempts()) == {1}
    assert status == 0, stopped.tail()
    log = stopped.log.read_text()
    # It stopped claiming, let the turns it held finish (sent by its own outbox sender or the
    # other worker's), and gave nothing back to wait for a lease to run out. (Rows a claim
    # had just taken when the stop came are given back at once, "inbox.claim.given_back",
    # for the other worker: `held` and the single attempts above show no customer waited.)
    assert "inbox.stopping" in log, stopped.tail()
    finished = log.split("inbox.stopping", 1)[1]
    assert "inbox.turn.answered" in finished, stopped.tail()
    assert "inbox.turn.given_back" not in log
    assert "inbox.give_back.failed" not in log
    assert "Traceback" not in log
    assert other.alive()
