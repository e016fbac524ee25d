"""What each answer gate and mode changes, measured on the evaluation questions of
`bench.eval_answers` (the bundled shop), in one process on one database:

    .venv/bin/python -m bench.eval_modes              # every configuration
    .venv/bin/python -m bench.eval_modes --only 'nl-' # some questions only

Configurations (a model where one is needed is `bench.simulated_model`: it writes from the
prompt's sources and makes the mistakes the gates exist for, at seeded rates):

- ``extractive``: no model, the deployed default (the baseline);
- ``model``: the simulated model, answers streamed, validation only recorded;
- ``model+validate``: answers held until validated (one retry, then the quote or a deferral);
- ``model+critic``: validation and the critic (simulated too), with one retry to retrieval;
- ``explore``: exploration mode, a scripted explorer (grep the question's words, open the
  two pages that match most, answer from them);
- ``cached``: the extractive baseline asked twice; the second pass is measured;
- small talk: how many evaluation questions it would wrongly take for small talk, and what a
  greeting costs.

Printed per configuration: the share of answerable questions answered right (the reply holds
every fact, not deferred), the share of unanswerable ones deferred, the answers a visitor sees
a planted fault in (a link to a page the shop does not have, an unclosed ``**``), the median
and p95 time of a turn, and model requests per turn.
"""

from __future__ import annotations

import argparse
import asyncio
import re
import statistics
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp.test_utils import TestServer

from bench.database import bench_settings
from bench.eval_answers import AGENT, DATA, Case, load_cases, open_shop, run_case
from bench.simulated_model import SimulatedModel
from core.answer.factory import build_pipeline
from core.answer.pipeline import AnswerPipeline, PipelineConfig
from core.answer.smalltalk import small_talk
from core.cache import LocalCache
from core.llm.openai_chat import OpenAIChatModel
from core.ports import ChatModel
from core.settings import Settings
from core.store import Agents
from core.store.database import Database
from core.turns import CollectingTurnOutput, TurnRequest
from tests.fakes.openai import FakeOpenAI, calls, tool_call

WRITER = "sim-writer"
CRITIC = "sim-critic"
# The mistakes the simulated writer makes, per draft: about a third of its drafts are spoilt.
RATES = {"bad_citation": 0.10, "invented_url": 0.10, "broken_markdown": 0.05, "drift": 0.10}
GREETINGS = ("hi", "Hello!", "thanks!", "Thank you so much", "dank je", "bedankt!", "Danke",
             "merci beaucoup", "bye", "goedemorgen")  # fmt: skip
_CAT = re.compile(r"^\[(\d+)\] (.*)\nURL: (.*)\n\n(.*)\Z", re.S)
_GREP_LINE = re.compile(r"^(/\S+?):\d+: ", re.M)


@dataclass
class Run:
    name: str
    right: list[bool]
    deferred: list[bool]
    faulty: int
    seconds: list[float]
    model_requests: int
    turns: int
    answers: dict[str, tuple[bool, str]]  # qid -> (right, the reply)

    def line(self) -> str:
        p95 = statistics.quantiles(self.seconds, n=20)[18] if len(self.seconds) > 1 else 0.0
        return (
            f"{self.name:<16}{_share(self.right):>8}{_share(self.deferred):>10}"
            f"{self.faulty:>8}{statistics.median(self.seconds) * 1000:>10.0f}"
            f"{p95 * 1000:>9.0f}{self.model_requests / max(1, self.turns):>10.2f}"
        )


def _share(flags: Sequence[bool]) -> str:
    return f"{sum(flags) / len(flags):.2f}" if flags else "-"


def _faulty(answer: str) -> bool:
    """A planted fault the visitor would see."""
    return "deals.example.net" in answer or answer.count("**") % 2 == 1


class Explorer:
    """A scripted exploring model over `SimulatedModel`'s writing: grep, cat two, answer."""

    def __init__(self, writer: SimulatedModel) -> None:
        self._writer = writer

    def reply(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body["messages"]
        question = next(
            m["content"] for m in reversed(messages) if m["role"] == "user" and m["content"]
        )
        results = [str(m["content"]) for m in messages if m["role"] == "tool"]
        opened = [r for r in results if _CAT.match(r)]
        if not results:
            words = sorted({w for w in re.findall(r"\w{4,}", question)}, key=len, reverse=True)
            return calls(*(tool_call("grep", {"pattern": w}) for w in words[:2]))
        if not opened:
            counts: dict[str, int] = {}
            for result in results:
                for path in _GREP_LINE.findall(result):
                    counts[path] = counts.get(path, 0) + 1
            best = sorted(counts, key=lambda p: -counts[p])[:2]
            if best:
                return calls(*(tool_call("cat", {"path": p}) for p in best))
        system = str(messages[0]["content"])
        for result in opened:
            number, title, url, text = _CAT.match(result).groups()  # type: ignore[union-attr]
            system += f'\n<source id="{number}" url="{url}" title="{title}">\n{text}\n</source>'
        body = {"model": WRITER, "messages": [{"role": "system", "content": system},
                                               {"role": "user", "content": question}]}  # fmt: skip
        return {"content": self._writer.reply(body)}


async def _ask_all(
    pipeline: AnswerPipeline, database: Database, cases: Sequence[Case], name: str, fake: FakeOpenAI
) -> Run:
    before = len(fake.turn_requests)
    right, deferred, seconds, faulty = [], [], [], 0
    turns = 0
    answers: dict[str, tuple[bool, str]] = {}
    for case in cases:
        started = time.perf_counter()
        reply = await run_case(pipeline, database.pool, case, session=f"{name}:")
        seconds.append((time.perf_counter() - started) / (len(case.history) + 1))
        turns += len(case.history) + 1
        if case.answerable:
            right.append(reply.right)
        else:
            deferred.append(reply.deferred)
        faulty += _faulty(reply.answer)
        answers[case.qid] = (reply.right, reply.answer)
    requests = len(fake.turn_requests) - before
    return Run(name, right, deferred, faulty, seconds, requests, turns, answers)


async def _configure(agents: Agents, **settings: Any) -> None:
    await agents.update(AGENT, settings={"answer_cache": False, **settings})


async def evaluate(settings: Settings, cases: Sequence[Case]) -> list[Run]:
    database, embedder, agents = await open_shop(settings)
    writer = SimulatedModel(encode=embedder._encode, rates=RATES)
    fake = FakeOpenAI(responder=writer.reply, tool_responder=Explorer(writer).reply)
    server = TestServer(fake.app())
    await server.start_server()
    chat = OpenAIChatModel(WRITER, api_key="sim", base_url=str(server.make_url("/v1")))
    config = PipelineConfig(pace_seconds=0.0, critic_model=CRITIC)
    runs = []
    built: list[AnswerPipeline] = []
    async with aiohttp.ClientSession() as session:

        def pipeline(model: ChatModel | None) -> AnswerPipeline:
            built.append(
                build_pipeline(
                    settings, database.pool, LocalCache(), embedder, session, model, config=config
                )
            )
            return built[-1]

        plans: list[tuple[str, ChatModel | None, Mapping[str, Any]]] = [
            ("extractive", None, {}),
            ("model", chat, {"answer_gates": []}),
            ("model+validate", chat, {"answer_gates": ["validate"]}),
            ("model+critic", chat, {"answer_gates": ["validate", "critic"]}),
            ("explore", chat, {"answer_gates": [], "exploration": True}),
        ]
        for name, model, agent_settings in plans:
            await _configure(agents, **agent_settings)
            runs.append(await _ask_all(pipeline(model), database, cases, name, fake))
            print(f"  {name}: done", flush=True)
        await agents.update(AGENT, settings={})  # the answer cache as deployed: on
        cached = pipeline(None)
        first = await _ask_all(cached, database, cases, "first pass", fake)
        runs.append(await _ask_all(cached, database, cases, "cached (2nd)", fake))
        hits = await database.pool.fetchval("SELECT count(*) FROM turns WHERE mode = 'cached'")
        print(f"  cached: {hits} answers served from the cache on the second pass", flush=True)
        # What the cache changed: each reply that differs from the same question's without it.
        without = runs[0].answers
        for label, run in (("first pass", first), ("second pass", runs[-1])):
            for qid, (right, answer) in run.answers.items():
                if right != without[qid][0]:
                    matched = await database.pool.fetchval(
                        "SELECT t.trace -> 'answer_cache_match' FROM turns t JOIN conversations c"
                        " ON c.id = t.conversation_id WHERE c.conversation_key = $1"
                        " ORDER BY t.id DESC LIMIT 1",
                        f"{run.name}:{qid}",
                    )
                    print(f"    {label} {qid}: {'right' if right else 'wrong'}: {answer[:140]!r}")
                    print(f"      without the cache: {without[qid][1][:140]!r}")
                    print(f"      served for: {matched}")
        await _small_talk(pipeline(None), cases)
        for each in built:
            await each.memory.drain()  # summaries and topics still being written
    await chat.close()
    await server.close()
    await database.close()
    print(f"\nsimulated writer: {writer.drafts} drafts, planted faults {writer.defects}")
    return runs


async def _small_talk(pipeline: AnswerPipeline, cases: Sequence[Case]) -> None:
    taken = [c.question for c in cases if small_talk(c.question) is not None]
    seconds = []
    for number, text in enumerate(GREETINGS):
        output = CollectingTurnOutput()
        started = time.perf_counter()
        request = TurnRequest(
            agent=AGENT, channel="web", conversation_key=f"hi-{number}", text=text, language=None
        )
        await pipeline.run(request, output)
        seconds.append(time.perf_counter() - started)
        assert (output.done or {}).get("mode") == "smalltalk", text
    print(
        f"  small talk: {len(taken)} of {len(cases)} evaluation questions taken for small talk"
        f"{': ' + '; '.join(taken) if taken else ''}; {len(GREETINGS)} greetings answered in "
        f"median {statistics.median(seconds) * 1000:.0f} ms without search or model",
        flush=True,
    )


def print_runs(runs: Sequence[Run]) -> None:
    print(
        f"\n{'configuration':<16}{'right':>8}{'deferred':>10}{'faulty':>8}"
        f"{'median ms':>10}{'p95 ms':>9}{'requests':>10}"
    )
    for run in runs:
        print(run.line())
    print(
        "\nright: answerable questions whose reply holds every fact; deferred: unanswerable "
        "ones deferred;\nfaulty: replies showing a planted fault; ms: per turn; requests: "
        "model requests per turn."
    )


async def main(args: argparse.Namespace) -> None:
    cases = load_cases(Path(args.questions))
    if args.only:
        cases = [c for c in cases if re.search(args.only, f"{c.qid} {c.kind}")]
    async with bench_settings() as settings:
        runs = await evaluate(settings, cases)
    print_runs(runs)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--questions", default=str(DATA / "answers.jsonl"))
    parser.add_argument("--only", help="regular expression on 'qid kind'")
    return parser


if __name__ == "__main__":
    asyncio.run(main(_parser().parse_args()))
