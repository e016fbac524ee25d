"""`parley ingest`, `parley search` (single and --batch) and `parley rebuild-index` as a user runs them."""

from __future__ import annotations

import asyncio
import fcntl
import json
import os
import re
import select
import struct
import subprocess
import termios
import time
from pathlib import Path

import asyncpg
import pytest
from aiohttp.test_utils import TestServer

from tests.fakes.openai import FakeOpenAI
from tests.support.cli import PARLEY, clean_env, run_parley
from tests.support.services import free_port

RETURNS = (
    "# Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days.\n"
)
SHIPPING = "# Shipping\nOrders to Belgium arrive in 2-3 working days. Shipping costs 4.95 euro.\n"
VERZENDING = "# Verzending\nBestellingen naar België komen binnen 2-3 werkdagen aan.\n"


def _site(root: Path) -> Path:
    for relative, text in {
        "en/returns.md": RETURNS,
        "en/shipping.md": SHIPPING,
        "nl/verzending.md": VERZENDING,
    }.items():
        path = root / "site" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
    return root / "site"


@pytest.fixture
def shop(tmp_path: Path, database_url: str) -> Path:
    created = run_parley("agent", "create", "shop", cwd=tmp_path, PARLEY_DATABASE_URL=database_url)
    assert created.returncode == 0, created.stderr
    ingested = run_parley(
        "ingest",
        "--agent",
        "shop",
        str(_site(tmp_path)),
        cwd=tmp_path,
        PARLEY_DATABASE_URL=database_url,
    )
    assert ingested.returncode == 0, ingested.stderr
    assert "3 added, 0 updated, 0 unchanged, 0 removed, 0 unreadable" in ingested.stdout
    return tmp_path


def test_search_prints_ranked_results(shop: Path, database_url: str) -> None:
    result = run_parley(
        "search",
        "--agent",
        "shop",
        "How long until I get my refund?",
        cwd=shop,
        PARLEY_DATABASE_URL=database_url,
    )
    assert result.returncode == 0, result.stderr
    first = result.stdout.splitlines()[0]
    assert first.startswith(" 1. ")
    assert "/en/returns.md" in first
    as_json = run_parley(
        "search",
        "--agent",
        "shop",
        "Hoe lang duurt verzending naar België?",
        "--json",
        "--k",
        "3",
        cwd=shop,
        PARLEY_DATABASE_URL=database_url,
    )
    body = json.loads(as_json.stdout)
    assert body["language"] == "nl"
    assert body["results"][0]["url"] == "/nl/verzending.md"
    assert all(r["url"] != "/en/shipping.md" for r in body["results"])  # language-folder rule
    assert len(body["results"]) <= 3


def test_search_batch_reads_and_writes_jsonl(shop: Path, database_url: str) -> None:
    questions = shop / "questions.jsonl"
    questions.write_text(
        "\n".join(
            json.dumps(q)
            for q in [
                {"qid": "q1", "question": "Can I send something back?", "lang": "en"},
                {"qid": "q2", "question": "Wat kost verzending?", "lang": "nl"},
                {"qid": "q3", "question": "shipping cost Belgium"},
            ]
        ),
        encoding="utf-8",
    )
    result = run_parley(
        "search",
        "--agent",
        "shop",
        "--batch",
        str(questions),
        "--k",
        "2",
        cwd=shop,
        PARLEY_DATABASE_URL=database_url,
    )
    assert result.returncode == 0, result.stderr
    rows = [json.loads(line) for line in result.stdout.splitlines()]
    assert [r["qid"] for r in rows] == ["q1", "q2", "q3"]
    assert rows[0]["results"][0]["url"] == "/en/returns.md"
    assert rows[1]["results"][0]["url"] == "/nl/verzending.md"
    assert rows[2]["results"][0]["url"] == "/en/shipping.md"
    for row in rows:
        assert len(row["results"]) <= 2
        assert set(row["results"][0]) == {"url", "score"}
        assert len({r["url"] for r in row["results"]}) == len(row["results"])  # one line per page


def test_search_errors_are_one_line(shop: Path, database_url: str) -> None:
    unknown = run_parley(
        "search", "--agent", "nope", "hello", cwd=shop, PARLEY_DATABASE_URL=database_url
    )
    assert unknown.returncode == 2
    assert unknown.stderr.strip() == "parley: error: unknown agent 'nope'"
    bad = shop / "bad.jsonl"
    bad.write_text('{"qid": 1, "question": "ok"}\n{"qid": 2}\n', encoding="utf-8")
    result = run_parley(
        "search", "--agent", "shop", "--batch", str(bad), cwd=shop, PARLEY_DATABASE_URL=database_url
    )
    assert result.returncode == 2
    assert result.stderr.strip() == f"parley: error: {bad}:2: needs qid and question"


def test_ingest_reports_unreadable_files_and_exits_1(shop: Path, database_url: str) -> None:
    site = shop / "site"
    (site / "en" / "broken.txt").write_bytes(b"\xff\xfe broken")
    result = run_parley(
        "ingest", "--agent", "shop", str(site), cwd=shop, PARLEY_DATABASE_URL=database_url
    )
    assert result.returncode == 1
    assert f"{site / 'en' / 'broken.txt'}: not UTF-8 text (byte 0)" in result.stderr
    assert (
        "0 added, 0 updated, 3 unchanged, 0 removed, 1 unreadable (0 chunks embedded)"
        in result.stdout
    )


async def _parley(*args: str, cwd: Path, **env: str) -> tuple[int, str, str]:
    """Run the CLI without blocking this event loop (a fake server runs on it)."""
    process = await asyncio.create_subprocess_exec(
        PARLEY,
        *args,
        cwd=cwd,
        env=clean_env(**env),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(process.communicate(), timeout=120)
    assert process.returncode is not None
    return process.returncode, out.decode(), err.decode()


async def test_switching_embedder_needs_rebuild_index(shop: Path, database_url: str) -> None:
    fake = FakeOpenAI(dimension=48)
    server = TestServer(fake.app())
    await server.start_server()
    openai_env = {
        "PARLEY_DATABASE_URL": database_url,
        "PARLEY_EMBED_PROVIDER": "openai",
        "PARLEY_EMBED_MODEL": "tiny-embedder",
        "PARLEY_EMBED_BASE_URL": str(server.make_url("/v1")),
        "PARLEY_LLM_API_KEY": "sk-test",
    }
    try:
        code, _, err = await _parley("search", "--agent", "shop", "refund", cwd=shop, **openai_env)
        assert code == 2
        assert "run `parley rebuild-index --agent shop`" in err
        assert "512 dimensions" in err
        assert "48 dimensions" in err

        code, out, err = await _parley("rebuild-index", "--agent", "shop", cwd=shop, **openai_env)
        assert code == 0, err
        assert "re-embedded 3 chunks of shop with openai:tiny-embedder (48 dimensions)" in out
        # and the vectors of the pieces answers quote: all of the new embedder, none stale
        conn = await asyncpg.connect(database_url)
        try:
            pieces = await conn.fetch("SELECT embedder, length(vector) AS size FROM piece_vectors")
        finally:
            await conn.close()
        assert pieces
        assert {(p["embedder"], p["size"]) for p in pieces} == {("openai:tiny-embedder", 2 * 48)}

        code, out, err = await _parley(
            "search",
            "--agent",
            "shop",
            "--json",
            "Returns\nYou can return any item within 30 days. Refunds arrive within 5 working days.",
            cwd=shop,
            **openai_env,
        )
        assert code == 0, err
        assert json.loads(out)["results"][0]["url"] == "/en/returns.md"

        # and back: the default embedder is now the mismatched one
        code, _, err = await _parley(
            "search", "--agent", "shop", "refund", cwd=shop, PARLEY_DATABASE_URL=database_url
        )
        assert code == 2
        assert "rebuild-index" in err
    finally:
        await server.close()


def _in_terminal(*args: str, cwd: Path, timeout: float = 120, **env: str) -> tuple[int, str]:
    """Run the CLI with stdout and stderr on a pseudo-terminal 120 columns wide, as in a
    shell window; its exit status and all it wrote there."""
    ours, theirs = os.openpty()
    fcntl.ioctl(theirs, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(
        [PARLEY, *args],
        cwd=cwd,
        env=clean_env(**env),
        stdin=subprocess.DEVNULL,
        stdout=theirs,
        stderr=theirs,
    )
    os.close(theirs)
    written = bytearray()
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([ours], [], [], 1)
            if not ready:
                continue
            try:
                data = os.read(ours, 65536)
            except OSError:  # EIO: the terminal's other side is closed, the command is done
                break
            if not data:
                break
            written += data
        status = process.wait(timeout=10)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(ours)
    return status, written.decode()


def _screen_lines(written: str) -> list[str]:
    """What stays on the screen: a carriage return starts its line over."""
    lines = [line.split("\r")[-1] for line in written.replace("\r\n", "\n").split("\n")]
    return [line.strip() for line in lines if line.strip()]


def test_ingest_shows_progress_on_a_terminal_then_one_summary_line(
    shop: Path, database_url: str
) -> None:
    site = shop / "site"
    for n in range(5):
        (site / "en" / f"news-{n}.md").write_text(
            f"# News {n}\nThe shop opens a store in city number {n} this spring.\n",
            encoding="utf-8",
        )
    status, written = _in_terminal(
        "ingest",
        "--agent",
        "shop",
        str(site),
        "--base-url",
        "https://shop.example",
        cwd=shop,
        PARLEY_DATABASE_URL=database_url,
    )
    assert status == 0, written
    # The bar counts pages out of the folder's eight, with the chunks cut and embedded.
    states = re.split(r"[\r\n]", written)  # each drawing of the bar starts with \r
    assert any(
        re.fullmatch(r"site: +0%\|.*\| 0/8 pages \[.*, 8 chunks, 0 embedded\]", s) for s in states
    )
    assert any(
        re.fullmatch(r"site: 100%\|.*\| 8/8 pages \[.*, 8 chunks, 8 embedded\]", s) for s in states
    )
    # It is cleared at the end: the summary is all that stays.
    assert _screen_lines(written) == [
        f"{site}: 8 added, 0 updated, 0 unchanged, 3 removed, 0 unreadable (8 chunks embedded)"
    ]


def test_a_folder_without_base_url_warns_that_answers_cite_paths(
    shop: Path, database_url: str
) -> None:
    site = shop / "site"
    plain = run_parley(
        "ingest", "--agent", "shop", str(site), cwd=shop, PARLEY_DATABASE_URL=database_url
    )
    assert plain.returncode == 0, plain.stderr
    [warning] = plain.stderr.splitlines()
    assert warning.startswith(
        f"parley: warning: without --base-url, answers cite the pages of {site}"
    )
    assert "run again with --base-url https://" in warning
    jsonl = shop / "pages.jsonl"  # its lines carry their own addresses: nothing to warn about
    jsonl.write_text(
        json.dumps({"url": "https://shop.example/faq", "text": "Open every day."}) + "\n",
        encoding="utf-8",
    )
    lines = run_parley(
        "ingest", "--agent", "shop", str(jsonl), cwd=shop, PARLEY_DATABASE_URL=database_url
    )
    assert lines.returncode == 0, lines.stderr
    assert lines.stderr == ""
    assert lines.stdout == (
        f"{jsonl}: 1 added, 0 updated, 0 unchanged, 0 removed, 0 unreadable (1 chunks embedded)\n"
    )  # and no progress bar when the output is not a terminal


def test_an_unreachable_site_is_named_once_and_retries_keep_one_source_row(
    shop: Path, database_url: str
) -> None:
    env = {"PARLEY_DATABASE_URL": database_url, "PARLEY_CRAWL_ALLOW_NETWORKS": "127.0.0.0/8"}
    site = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    for given in (site, f"{site}/"):
        failed = run_parley("ingest", "--agent", "shop", given, cwd=shop, **env)
        assert failed.returncode == 2
        assert failed.stderr == f"parley: error: {site}/: could not connect: connection refused\n"
    page = shop / "hours.md"
    page.write_text("# Opening hours\nWe are open every day from 9 to 5.\n", encoding="utf-8")
    added = run_parley(
        "ingest",
        "--agent",
        "shop",
        str(page),
        "--base-url",
        "https://shop.example",
        cwd=shop,
        **env,
    )
    assert added.returncode == 0, added.stderr

    listed = run_parley("source", "list", "--agent", "shop", cwd=shop, **env)
    assert listed.returncode == 0, listed.stderr
    header, *rows = listed.stdout.splitlines()
    assert re.split(r"\s{2,}", header) == [
        "ID", "KIND", "STATUS", "PAGES", "LAST CRAWL", "LOCATION", "LAST ERROR"
    ]  # fmt: skip
    assert [row.split()[:4] for row in rows] == [
        ["1", "directory", "ready", "3"],
        ["2", "url", "failed", "0"],  # every try updated the one row
        ["3", "file", "ready", "1"],  # and drew no ids of its own
    ]
    assert rows[1].count(site) == 1
    assert re.search(rf"{re.escape(site)}/ +could not connect: connection refused$", rows[1])


def _search_into_a_closed_pipe(*args: str, cwd: Path, database_url: str) -> tuple[int, str]:
    """`parley search ... | head`, the reader gone before the first line is written."""
    process = subprocess.Popen(
        [PARLEY, "search", "--agent", "shop", *args],
        cwd=cwd,
        env=clean_env(PARLEY_DATABASE_URL=database_url),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert process.stdout is not None
    assert process.stderr is not None
    process.stdout.close()
    with process.stderr:
        errors = process.stderr.read()
    return process.wait(timeout=60), errors


def test_search_into_a_reader_that_stops_early_ends_quietly(shop: Path, database_url: str) -> None:
    status, errors = _search_into_a_closed_pipe(
        "How long until I get my refund?", cwd=shop, database_url=database_url
    )
    assert "Traceback" not in errors
    assert "BrokenPipe" not in errors
    assert "Exception ignored" not in errors
    assert status == 141  # as a command stopped by SIGPIPE
    # A batch writes more than a pipe holds, so its writes fail while it runs.
    questions = shop / "questions.jsonl"
    questions.write_text(
        "\n".join(
            json.dumps({"qid": f"q-{n:03d}-{'x' * 40}", "question": f"refund for order {n}"})
            for n in range(150)
        ),
        encoding="utf-8",
    )
    status, errors = _search_into_a_closed_pipe(
        "--batch", str(questions), cwd=shop, database_url=database_url
    )
    assert errors == ""
    assert status == 141
