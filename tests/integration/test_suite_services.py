"""The test session's own services outlive what else happens during a run, and a run leaves
nothing behind in the Redis it shares with the machine.

Run as root, the embedded PostgreSQL of a test session runs as the unprivileged `embedded_postgres`
user and must be able to walk down to its data folder. Every pytest run of the same user
resets pytest's temporary root (``/tmp/pytest-of-<user>``) to mode 0700 when it starts, so a
server whose data lay below it lost its way in at the next checkpoint (``PANIC: could not
open file ".../global/pg_control": Permission denied``, after the next CREATE or DROP
DATABASE) and every later test errored with "connection refused". That is how a `make test`
whose browser tests had just failed lost its database while another run started beside it
(another terminal, an editor's test runner); the browser tests were not the cause.

Here a pytest run in a subprocess, on a temporary root of its own and without Chromium, runs
a browser test, then starts another pytest run, then tests that create and drop databases:
only the browser test may fail.

Tests write to Redis only under a prefix of their session's (tests/support/redis_keys.py),
and the session deletes its keys when it ends: a run of tests that write caches, counters
without expiry, rate-limit buckets and conversation memory leaves an empty server.
"""

from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest
import redis

from tests.support.services import RedisServer

ROOT = Path(__file__).resolve().parents[2]

BROWSER_TEST = "tests/e2e/test_memory_widget.py"
DATABASE_TESTS = [
    "tests/integration/test_store.py::test_a_failing_migration_leaves_no_trace",
    "tests/integration/test_store.py::test_create_and_read_agents",
]

# Keys of every kind: cached values, counters without expiry, token buckets, and what a
# gateway writes while it answers the widget (rate limits, retrieval cache, memory).
REDIS_TESTS = [
    "tests/integration/test_cache.py::test_incr_without_ttl_persists",
    "tests/integration/test_cache.py::test_token_bucket_limits_and_refills",
    "tests/integration/test_cache.py::test_set_get_overwrite_and_missing",
    "tests/integration/test_memory.py::test_the_widget_clears_a_session_with_its_key_from_an_allowed_origin",
]

ANOTHER_RUN = """
import subprocess
import sys


def test_another_test_run_starts(tmp_path):
    probe = tmp_path / "test_probe.py"
    probe.write_text("def test_probe(tmp_path):\\n    assert tmp_path.is_dir()\\n")
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(probe)],
        cwd=tmp_path, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
"""


def _outcomes(report: Path) -> dict[str, str]:
    """Test name -> passed, failed, error or skipped, from a JUnit XML report."""
    outcomes: dict[str, str] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        kinds = {child.tag for child in case} & {"failure", "error", "skipped"}
        outcome = "error" if "error" in kinds else next(iter(kinds), "passed")
        outcomes[case.get("name", "")] = outcome.replace("failure", "failed")
    return outcomes


@pytest.mark.timeout(600)
def test_without_chromium_only_the_browser_tests_fail(tmp_path: Path) -> None:
    temproot = tmp_path / "temproot"
    temproot.mkdir()
    other = tmp_path / "other"
    other.mkdir()
    (other / "test_another_run.py").write_text(ANOTHER_RUN)
    report = tmp_path / "report.xml"
    env = {
        **os.environ,
        "PARLEY_TEST_CHROMIUM": str(tmp_path / "no-chromium"),
        # this run's temporary root, and the one the run it starts resets
        "PYTEST_DEBUG_TEMPROOT": str(temproot),
    }
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
            f"--junitxml={report}",
            BROWSER_TEST, str(other / "test_another_run.py"), *DATABASE_TESTS,
        ],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    output = run.stdout[-6000:] + run.stderr[-2000:]
    assert "need Debian's Chromium" in run.stdout, output
    outcomes = _outcomes(report)
    assert outcomes == {
        "test_new_conversation_clears_the_old_sessions_memory": "failed",
        "test_another_test_run_starts": "passed",
        "test_a_failing_migration_leaves_no_trace": "passed",
        "test_create_and_read_agents": "passed",
    }, output


@pytest.mark.timeout(600)
def test_a_run_leaves_no_keys_in_redis(private_redis: RedisServer, tmp_path: Path) -> None:
    client = redis.Redis.from_url(private_redis.url, decode_responses=True)
    client.config_resetstat()
    report = tmp_path / "report.xml"
    run = subprocess.run(
        [
            sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
            "--rootdir", str(ROOT), "-c", str(ROOT / "pyproject.toml"),
            f"--junitxml={report}", *REDIS_TESTS,
        ],
        cwd=ROOT, env={**os.environ, "PARLEY_REDIS_URL": private_redis.url},
        capture_output=True, text=True, timeout=540, check=False,
    )  # fmt: skip
    output = run.stdout[-6000:] + run.stderr[-2000:]
    assert run.returncode == 0, output
    outcomes = _outcomes(report)
    assert len(outcomes) >= len(REDIS_TESTS), outcomes
    assert set(outcomes.values()) == {"passed"}, outcomes

    stats = client.info("commandstats")
    written = sum(
        stats.get(f"cmdstat_{command}", {}).get("calls", 0)
        for command in ("set", "incrby", "evalsha", "eval", "rpush", "hset")
    )
    assert written > 0, stats  # the tests did write
    left = list(client.scan_iter(count=1000))
    client.close()
    assert left == [], left[:20]
