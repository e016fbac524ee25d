"""`parley ingest`, `parley search` (single and --batch) and `parley rebuild-index` as a user runs them."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest
from aiohttp.test_utils import TestServer

from tests.fakes.openai import FakeOpenAI
from tests.support.cli import PARLEY, clean_env, run_parley

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
