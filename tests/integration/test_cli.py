"""The `parley` command end to end: clear one-line errors, the embedded default, serve."""

from __future__ import annotations

import asyncio
import json
import signal
import socket
import subprocess
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import psutil
from aiohttp.test_utils import TestServer

from core.store.embedded import USERS_FILE
from core.store.migrate import bundled_migrations
from tests.fakes.openai import FakeOpenAI
from tests.support.cli import PARLEY, clean_env, run_parley, wait_until_up
from tests.support.services import free_port

LATEST = bundled_migrations()[-1].version


def _one_line_error(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert "Traceback" not in result.stderr
    assert lines[0].startswith("parley: error: ")
    return lines[0]


def _postgres_running_in(pgdata: Path) -> bool:
    for proc in psutil.process_iter(attrs=["name", "cmdline"]):
        if proc.info["name"] == "postgres" and str(pgdata) in " ".join(proc.info["cmdline"] or []):
            return True
    return False


def _stop_postgres_in(pgdata: Path) -> None:
    found = [
        proc
        for proc in psutil.process_iter(attrs=["name", "cmdline"])
        if proc.info["name"] == "postgres" and str(pgdata) in " ".join(proc.info["cmdline"] or [])
    ]
    for proc in found:
        proc.terminate()
    psutil.wait_procs(found, timeout=10)


def test_help_lists_the_commands(tmp_path: Path) -> None:
    # The installed console script itself, once.
    result = run_parley("--help", cwd=tmp_path, process=True)
    assert result.returncode == 0
    for command in ("serve", "migrate", "agent"):
        assert command in result.stdout
    agent_help = run_parley("agent", "--help", cwd=tmp_path)
    for action in ("create", "list", "show"):
        assert action in agent_help.stdout


def test_agents_on_a_database_url(tmp_path: Path, database_url: str) -> None:
    created = run_parley(
        "agent",
        "create",
        "shop",
        "--language",
        "nl",
        "--timezone",
        "Europe/Amsterdam",
        cwd=tmp_path,
        PARLEY_DATABASE_URL=database_url,
    )
    assert created.returncode == 0, created.stderr
    assert "created agent shop" in created.stdout
    widget_key = created.stdout.strip().splitlines()[-1].split()[-1]
    assert widget_key.startswith("pk_")
    assert created.stderr == ""  # one-shot commands keep quiet unless asked

    listed = run_parley("agent", "list", "--json", cwd=tmp_path, PARLEY_DATABASE_URL=database_url)
    [row] = [json.loads(line) for line in listed.stdout.splitlines()]
    assert row["name"] == "shop"
    assert row["language"] == "nl"
    assert row["timezone"] == "Europe/Amsterdam"
    assert row["widget_key"] == widget_key

    again = run_parley("agent", "create", "shop", cwd=tmp_path, PARLEY_DATABASE_URL=database_url)
    assert "agent 'shop' already exists" in _one_line_error(again)
    unknown = run_parley("agent", "show", "nope", cwd=tmp_path, PARLEY_DATABASE_URL=database_url)
    assert "unknown agent 'nope'" in _one_line_error(unknown)
    bad_zone = run_parley(
        "agent",
        "create",
        "other",
        "--timezone",
        "Amsterdam",
        cwd=tmp_path,
        PARLEY_DATABASE_URL=database_url,
    )
    assert "IANA time zone" in _one_line_error(bad_zone)


def test_unreachable_database_is_one_line_without_the_password(tmp_path: Path) -> None:
    port = free_port()  # nothing listens there
    result = run_parley(
        "migrate",
        cwd=tmp_path,
        PARLEY_DATABASE_URL=f"postgresql://parley:s3cret-pw@127.0.0.1:{port}/parley",
    )
    line = _one_line_error(result)
    assert f"cannot reach the database at 127.0.0.1:{port}/parley" in line
    assert "s3cret-pw" not in result.stderr + result.stdout


def test_invalid_setting_stops_the_start(tmp_path: Path) -> None:
    result = run_parley("serve", cwd=tmp_path, PARLEY_PORT="eighty")
    assert _one_line_error(result).startswith("parley: error: invalid setting PARLEY_PORT:")


def test_worker_concurrency_is_checked_before_anything_starts(tmp_path: Path) -> None:
    result = run_parley("worker", "--concurrency", "0", cwd=tmp_path)
    assert _one_line_error(result).startswith(
        "parley: error: invalid setting PARLEY_WORKER_CONCURRENCY:"
    )


def test_embedded_postgres_starts_is_reused_and_stops(tmp_path: Path) -> None:
    data = tmp_path / "data"
    first = run_parley("migrate", cwd=tmp_path, process=True, PARLEY_DATA_DIR=str(data))
    assert first.returncode == 0, first.stderr
    assert f"database is at migration {LATEST:04d} (embedded PostgreSQL)" in first.stdout
    pgdata = data / "postgres"
    assert (pgdata / "PG_VERSION").read_text().startswith("18")
    assert not _postgres_running_in(pgdata)  # stopped cleanly on exit

    created = run_parley(
        "agent", "create", "shop", cwd=tmp_path, process=True, PARLEY_DATA_DIR=str(data)
    )
    assert created.returncode == 0, created.stderr
    listed = run_parley("agent", "list", cwd=tmp_path, process=True, PARLEY_DATA_DIR=str(data))
    assert listed.stdout.startswith("shop\t")  # the data outlived the restart
    assert not _postgres_running_in(pgdata)


def test_the_last_process_stops_the_embedded_postgres_after_another_was_killed(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    pgdata = data / "postgres"
    killed = subprocess.Popen(
        [PARLEY, "worker"],
        cwd=tmp_path,
        env=clean_env(PARLEY_DATA_DIR=str(data)),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert killed.stdout is not None
        for line in killed.stdout:
            if "worker.started" in line:
                break
        else:
            raise AssertionError("the worker never said it started")
        killed.kill()  # SIGKILL: no chance to take itself off the server's list of users
        killed.wait(timeout=30)
        assert _postgres_running_in(pgdata)  # left behind, still in use as far as its package knows
        assert killed.pid in json.loads((pgdata / USERS_FILE).read_text())

        # The next process reuses the server, and as the last one left it stops it.
        again = run_parley("migrate", cwd=tmp_path, process=True, PARLEY_DATA_DIR=str(data))
        assert again.returncode == 0, again.stderr
        assert "(embedded PostgreSQL)" in again.stdout
        assert json.loads((pgdata / USERS_FILE).read_text()) == []
        assert not _postgres_running_in(pgdata)
    finally:
        if killed.poll() is None:
            killed.kill()
            killed.wait()
        if killed.stdout is not None:
            killed.stdout.close()
        _stop_postgres_in(pgdata)  # never leave a server behind, whatever failed


def test_two_processes_migrating_at_once_both_succeed(tmp_path: Path, fresh_database: str) -> None:
    procs = [
        subprocess.Popen(
            [PARLEY, "migrate"],
            cwd=tmp_path,
            env=clean_env(PARLEY_DATABASE_URL=fresh_database),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    assert all(f"database is at migration {LATEST:04d}" in out for out, _ in outputs)


def test_serve_answers_logs_request_ids_and_stops_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    data = tmp_path / "data"
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            [PARLEY, "serve"],
            cwd=tmp_path,
            stdout=log,
            stderr=subprocess.STDOUT,
            text=True,
            env=clean_env(PARLEY_PORT=str(port), PARLEY_DATA_DIR=str(data)),
        )
        try:
            wait_until_up(f"http://127.0.0.1:{port}/healthz", process)
            request = urllib.request.Request(
                f"http://127.0.0.1:{port}/readyz", headers={"X-Request-Id": "req-42"}
            )
            with urllib.request.urlopen(request, timeout=5) as response:
                assert json.load(response)["status"] == "ready"
            process.send_signal(signal.SIGTERM)
            assert process.wait(timeout=30) == 0
        finally:
            if process.poll() is None:
                process.kill()
    output = log_path.read_text()
    assert "gateway.started" in output
    assert "http.request method=GET path=/readyz status=200" in output
    assert "request_id=req-42" in output
    assert "gateway.stopped" in output
    assert "Traceback" not in output
    assert not _postgres_running_in(data / "postgres")


def test_serve_on_a_busy_port_is_one_line(tmp_path: Path, database_url: str) -> None:
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        result = run_parley(
            "serve", cwd=tmp_path, PARLEY_PORT=str(port), PARLEY_DATABASE_URL=database_url
        )
    assert f"port {port} on 127.0.0.1 is already in use" in _one_line_error(result)


def test_serve_takes_the_port_from_the_command_line_checked(tmp_path: Path) -> None:
    result = run_parley("serve", "--port", "70000", cwd=tmp_path)
    assert result.returncode == 2
    assert "argument --port: '70000' is not a port number (1-65535)" in result.stderr
    assert "Traceback" not in result.stderr


async def _until_up(url: str, process: asyncio.subprocess.Process, timeout: float = 240) -> None:
    """Poll ``url`` without blocking this event loop (a fake server runs on it)."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=2)) as http:
        while asyncio.get_running_loop().time() < deadline:
            if process.returncode is not None:
                raise AssertionError(f"parley exited early with status {process.returncode}")
            try:
                async with http.get(url) as response:
                    if response.status == 200:
                        return
            except (aiohttp.ClientError, TimeoutError):
                pass
            await asyncio.sleep(0.2)
    raise AssertionError(f"{url} did not answer within {timeout} s")


async def test_the_demo_starts_without_warnings_on_the_port_given_with_a_favicon(
    tmp_path: Path, database_url: str
) -> None:
    # Embeddings from a local fake, so that ingesting the sample shop takes seconds.
    embeddings = TestServer(FakeOpenAI(dimension=48).app())
    await embeddings.start_server()
    port = free_port()
    log_path = tmp_path / "demo.log"
    env = clean_env(
        PARLEY_DATABASE_URL=database_url,
        PARLEY_PORT=str(free_port()),  # the flag wins over the setting
        PARLEY_EMBED_PROVIDER="openai",
        PARLEY_EMBED_MODEL="tiny-embedder",
        PARLEY_EMBED_BASE_URL=str(embeddings.make_url("/v1")),
    )
    command = ("serve", "--demo", "--host", "127.0.0.1", "--port", str(port))
    with log_path.open("wb") as log:
        process = await asyncio.create_subprocess_exec(
            PARLEY, *command, cwd=tmp_path, env=env, stdout=log, stderr=subprocess.STDOUT
        )
    try:
        await _until_up(f"http://127.0.0.1:{port}/healthz", process)
        async with aiohttp.ClientSession() as http:
            async with http.get(f"http://127.0.0.1:{port}/favicon.ico") as icon:
                assert icon.status == 200
                assert icon.content_type == "image/x-icon"
                assert (await icon.read()).startswith(b"\x00\x00\x01\x00")  # an ICO file
            async with http.get(f"http://127.0.0.1:{port}/en/shipping.html") as page:
                assert page.status == 200
        process.send_signal(signal.SIGTERM)
        assert await asyncio.wait_for(process.wait(), timeout=30) == 0
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await embeddings.close()
    output = log_path.read_text()
    assert "demo.ready pages_added=" in output
    assert f"gateway.started host=127.0.0.1 port={port}" in output
    assert f"Staff console: http://127.0.0.1:{port}/admin" in output
    # A normal start has nothing to warn about: every page's canonical is itself.
    assert [line for line in output.splitlines() if " WARNING " in line] == []
    assert "Warning" not in output
    assert "Traceback" not in output
    assert "canonical.refused" not in output


def test_worker_runs_until_sigterm(tmp_path: Path, database_url: str) -> None:
    process = subprocess.Popen(
        [PARLEY, "worker"],
        cwd=tmp_path,
        env=clean_env(PARLEY_DATABASE_URL=database_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        assert process.stdout is not None
        for line in process.stdout:
            if "worker.started" in line:
                break
        else:
            raise AssertionError("the worker never said it started")
        process.send_signal(signal.SIGTERM)
        rest, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:  # never leave a worker behind, whatever failed
            process.kill()
            process.wait()
    assert process.returncode == 0
    assert "worker.stopped" in rest


def test_agent_update_changes_settings_and_refuses_nonsense(
    tmp_path: Path, database_url: str
) -> None:
    env = {"PARLEY_DATABASE_URL": database_url}
    assert run_parley("agent", "create", "shop", cwd=tmp_path, **env).returncode == 0
    updated = run_parley(
        "agent", "update", "shop", "--allowed-origin", "https://shop.example",
        "--allowed-origin", "https://www.shop.example/", "--threshold", "0.3",
        "--contact", "hello@shop.example", "--rate-limit-ip", "5/50", cwd=tmp_path, **env,
    )  # fmt: skip
    assert updated.returncode == 0, updated.stderr
    shown = run_parley("agent", "show", "shop", cwd=tmp_path, **env).stdout
    assert "https://shop.example, https://www.shop.example" in shown
    bad_rate = run_parley("agent", "update", "shop", "--rate-limit-ip", "fast", cwd=tmp_path, **env)
    assert "must look like 0.2/5" in _one_line_error(bad_rate)
    bad_threshold = run_parley("agent", "update", "shop", "--threshold", "7", cwd=tmp_path, **env)
    assert "invalid agent setting" in _one_line_error(bad_threshold)
    nothing = run_parley("agent", "update", "shop", cwd=tmp_path, **env)
    assert "nothing to change" in _one_line_error(nothing)


def test_agent_update_sets_and_clears_the_model_limits(tmp_path: Path, database_url: str) -> None:
    env = {"PARLEY_DATABASE_URL": database_url}
    assert run_parley("agent", "create", "shop", cwd=tmp_path, **env).returncode == 0
    limited = run_parley(
        "agent", "update", "shop", "--llm-concurrency", "16", "--llm-requests-per-minute", "500",
        cwd=tmp_path, **env,
    )  # fmt: skip
    assert limited.returncode == 0, limited.stderr
    settings = asyncio.run(_agent_settings(database_url, "shop"))
    assert (settings["llm_concurrency"], settings["llm_requests_per_minute"]) == (16, 500)
    cleared = run_parley(
        "agent", "update", "shop", "--llm-requests-per-minute", "0", cwd=tmp_path, **env
    )
    assert cleared.returncode == 0, cleared.stderr
    settings = asyncio.run(_agent_settings(database_url, "shop"))
    assert settings["llm_concurrency"] == 16
    assert "llm_requests_per_minute" not in settings
    bad = run_parley("agent", "update", "shop", "--llm-concurrency", "-2", cwd=tmp_path, **env)
    assert "llm_concurrency must be a whole number of at least 1" in _one_line_error(bad)


async def _agent_settings(database_url: str, slug: str) -> dict[str, Any]:
    conn = await asyncpg.connect(database_url)
    try:
        settings = await conn.fetchval("SELECT settings FROM agents WHERE slug = $1", slug)
    finally:
        await conn.close()
    return dict(json.loads(settings) if isinstance(settings, str) else settings)
