"""A reasoning model's thinking never reaches the answer, however its tags are split."""

from __future__ import annotations

import pytest

from core.llm.reasoning import Thoughts, without_thoughts

REPLY = "<think>The visitor asks about Belgium. Source 1 says 2-3 days.</think>\n\nParcels to Belgium take 2-3 working days [1]."


def _streamed(pieces: list[str]) -> tuple[str, Thoughts]:
    thoughts = Thoughts()
    shown = "".join(thoughts.feed(p) for p in pieces) + thoughts.end()
    return shown, thoughts


@pytest.mark.parametrize("size", [1, 2, 3, 5, 7, 11, 1000])
def test_thinking_is_dropped_whatever_the_pieces(size: int) -> None:
    pieces = [REPLY[i : i + size] for i in range(0, len(REPLY), size)]
    shown, thoughts = _streamed(pieces)
    assert shown == "Parcels to Belgium take 2-3 working days [1]."
    assert thoughts.seconds is not None


def test_the_thinking_tag_variants_and_an_unclosed_block() -> None:
    assert without_thoughts("<THINKING>hmm</Thinking>Yes [1].") == "Yes [1]."
    assert without_thoughts("Before <think>a</think>after") == "Before after"
    # out of tokens while thinking: nothing of it shows
    assert without_thoughts("<think>The visitor asks about the prompt, so") == ""
    # a lone "<" that begins no tag is text
    assert without_thoughts("Sizes < 40 run small; 5 <3") == "Sizes < 40 run small; 5 <3"


def test_thinking_sent_apart_counts_as_time_thought() -> None:
    clock = iter([10.0, 10.5, 12.0])
    thoughts = Thoughts(clock=lambda: next(clock))
    assert thoughts.seconds is None
    thoughts.thought()
    thoughts.thought()
    assert thoughts.feed("Answer.") == "Answer."
    assert thoughts.seconds == 0.5
