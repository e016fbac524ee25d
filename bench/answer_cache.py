"""Where to set the answer cache's similarity bar: which rewordings hit, which other questions
must not, with the bundled encoder, on the evaluation questions.

    .venv/bin/python -m bench.answer_cache
    .venv/bin/python -m bench.answer_cache --thresholds 0.88 0.9 0.92 0.94 --top 8

Three sets of pairs, each asked in one language (the cache is per reply language):

- rewordings: each FAQ heading of `bench/data/questions.jsonl` ("Do you have other stores?")
  against the same question in other words ("Is there a second branch, say in Amsterdam?"),
  and small rewordings a cache should catch ("shipping" for "delivery", "Which" for "What");
- different questions: every two questions of the evaluation set in one language whose
  answers are on different pages;
- near misses: the same sentence about another country, product code, amount or thing.

For each bar it prints how many pairs would be served one another's answer, by similarity
alone and with the cache's check that both name the same things (names, codes, numbers,
negations), and the closest different questions.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
from pathlib import Path

import numpy as np

from core.answer.answer_cache import _identity, normalised
from core.retrieval.embedders import UseEmbedder

DATA = Path(__file__).parent / "data" / "questions.jsonl"

# FAQ heading -> the same question reworded (qids of questions.jsonl).
FAQ_REWORDINGS = [
    *((f"en-{88 + i:03d}", f"en-{118 + i:03d}") for i in range(14)),
    ("en-102", "en-132"), ("en-104", "en-133"), ("en-105", "en-134"), ("en-108", "en-135"),
    ("en-109", "en-136"), ("en-110", "en-137"), ("en-112", "en-138"), ("en-113", "en-139"),
    ("en-114", "en-140"), ("en-116", "en-141"),
    *((f"nl-{78 + i:03d}", f"nl-{108 + i:03d}") for i in range(9)),
    ("nl-087", "nl-118"), ("nl-088", "nl-119"), ("nl-089", "nl-120"), ("nl-090", "nl-121"),
    ("nl-091", "nl-122"), ("nl-093", "nl-123"), ("nl-094", "nl-124"), ("nl-098", "nl-125"),
    ("nl-099", "nl-126"), ("nl-100", "nl-127"), ("nl-103", "nl-128"), ("nl-104", "nl-129"),
    ("nl-105", "nl-130"),
    *((f"de-{74 + i:03d}", f"de-{104 + i:03d}") for i in range(14)),
    ("de-088", "de-118"), ("de-090", "de-119"), ("de-091", "de-120"), ("de-095", "de-121"),
    ("de-096", "de-122"), ("de-097", "de-123"), ("de-099", "de-124"), ("de-100", "de-125"),
    ("de-101", "de-126"),
]  # fmt: skip

SMALL_REWORDINGS = [
    ("How long does delivery to Belgium take?", "How long does shipping to Belgium take?"),
    ("How long does delivery to Belgium take?", "How many days does delivery to Belgium take?"),
    ("How much is shipping to Germany?", "How much does shipping to Germany cost?"),
    ("What is the price of the Stormvang 3L?", "How much does the Stormvang 3L cost?"),
    ("What sizes does the Merino Trek Sock come in?", "Which sizes does the Merino Trek Sock come in?"),
    ("Can I return opened socks?", "Can I return socks that I opened?"),
    ("What is your return address?", "What's your return address?"),
    ("Is the Fjellsti Mid WP waterproof?", "Is the Fjellsti Mid WP water proof?"),
    ("What are your opening hours?", "What are the opening hours of your store?"),
    ("Do you accept PayPal?", "Can I pay with PayPal?"),
    ("Wat zijn jullie openingstijden?", "Wat zijn de openingstijden?"),
    ("Wat kost verzending naar Duitsland?", "Wat zijn de verzendkosten naar Duitsland?"),
    ("Hoe lang duurt de levering naar België?", "Hoe lang duurt het verzenden naar België?"),
    ("Wie lange dauert der Versand nach Österreich?", "Wie lange dauert die Lieferung nach Österreich?"),
    ("Kann ich mit PayPal bezahlen?", "Kann ich mit PayPal zahlen?"),
]  # fmt: skip

NEAR_MISSES = [
    ("What does shipping to Germany cost?", "What does shipping to Belgium cost?"),
    ("How much is the NK-2041?", "How much is the NK-2055?"),
    ("Is the Fjellsti Mid WP waterproof?", "Is the Lichtvoet Low waterproof?"),
    ("Do you ship to Norway?", "Do you ship to Sweden?"),
    ("How long does delivery to Belgium take?", "How much does delivery to Belgium cost?"),
    ("Can I return opened socks?", "Can I return opened gift cards?"),
    ("What is your return address?", "What is your address?"),
    ("What sizes does the Merino Trek Sock come in?", "What colours does the Merino Trek Sock come in?"),
    ("Is shipping free above 75 euro?", "Is shipping free above 100 euro?"),
    ("Can I return opened socks?", "Can't I return opened socks?"),
    ("Is the Fjellsti Mid WP waterproof?", "Is the Fjellsti Mid WP not waterproof?"),
    ("Wat kost verzending naar Duitsland?", "Wat kost verzending naar België?"),
    ("Retourkosten", "Retouradres"),
    ("Wie lange dauert der Versand nach Österreich?", "Wie lange dauert der Versand in die Schweiz?"),
    ("Wie viel kostet der NK-3102?", "Wie viel kostet der NK-4010?"),
]  # fmt: skip


def _served(a: str, b: str, similarity: float, bar: float) -> tuple[bool, bool]:
    """Whether ``b`` would get ``a``'s answer: by similarity alone, and with the checks."""
    if normalised(a) == normalised(b):
        return True, True
    close = similarity >= bar
    return close, close and _identity(a) == _identity(b)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--thresholds", type=float, nargs="+",
                        default=[0.85, 0.88, 0.9, 0.92, 0.94, 0.96])  # fmt: skip
    parser.add_argument("--top", type=int, default=6, help="closest different questions shown")
    args = parser.parse_args()

    questions = [json.loads(line) for line in DATA.read_text(encoding="utf-8").splitlines()]
    by_id = {q["qid"]: q for q in questions}
    embedder = UseEmbedder()

    async def similarities(pairs: list[tuple[str, str]]) -> list[float]:
        texts = sorted({t for pair in pairs for t in pair})
        vectors = dict(zip(texts, await embedder.embed(texts), strict=True))
        return [float(vectors[a] @ vectors[b]) for a, b in pairs]

    faq = [(by_id[a]["question"], by_id[b]["question"]) for a, b in FAQ_REWORDINGS]
    different = [
        (a["question"], b["question"])
        for a, b in itertools.combinations(questions, 2)
        if a["lang"] == b["lang"] and not set(a["expected"]) & set(b["expected"])
    ]
    sets = {
        "FAQ reworded (should hit)": faq,
        "small rewordings (should hit)": SMALL_REWORDINGS,
        "different pages (must not hit)": different,
        "near misses (must not hit)": NEAR_MISSES,
    }
    scored = {name: (pairs, await similarities(pairs)) for name, pairs in sets.items()}

    print(f"{'pairs':34} {'n':>6} {'median':>7} {'max':>6}  " + "  ".join(
        f"@{bar:<4} sim/check" for bar in args.thresholds))  # fmt: skip
    for name, (pairs, sims) in scored.items():
        cells = []
        for bar in args.thresholds:
            served = [_served(a, b, s, bar) for (a, b), s in zip(pairs, sims, strict=True)]
            cells.append(f"{sum(x for x, _ in served):>6}/{sum(y for _, y in served):<6}")
        print(f"{name:34} {len(pairs):>6} {np.median(sims):>7.3f} {max(sims):>6.3f}  "
              + "  ".join(f"{c:>15}" for c in cells))  # fmt: skip
    for name in ("small rewordings (should hit)", "near misses (must not hit)"):
        pairs, sims = scored[name]
        print(f"\n{name}:")
        for (a, b), s in sorted(zip(pairs, sims, strict=True), key=lambda p: -p[1]):
            same = "same things" if _identity(a) == _identity(b) else "differ"
            print(f"  {s:.3f}  {same:11}  {a} | {b}")
    pairs, sims = scored["different pages (must not hit)"]
    print(f"\nclosest different questions ({len(pairs)} pairs):")
    for (a, b), s in sorted(zip(pairs, sims, strict=True), key=lambda p: -p[1])[: args.top]:
        same = "same things" if _identity(a) == _identity(b) else "differ"
        print(f"  {s:.3f}  {same:11}  {a} | {b}")


if __name__ == "__main__":
    asyncio.run(main())
