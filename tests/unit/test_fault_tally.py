"""The fault runs' per-customer count: what makes a message lost, doubled or wrongly held."""

from __future__ import annotations

from core.answer.phrases import phrase
from tests.support.faults import Delivery, Message, answer_for, tally

HOLD = phrase("holding", "en")


def _message(number: int, acknowledged: bool = True) -> Message:
    return Message("whatsapp", f"whatsapp:+316{number:08d}", f"ref-{number:06d}", 0.0, acknowledged)


def _answer(number: int, at: float = 1.0) -> Delivery:
    return Delivery(
        at, answer_for({"messages": [{"role": "user", "content": f"ref-{number:06d}"}]})
    )


def test_each_customer_is_counted_by_what_reached_them() -> None:
    messages = [_message(n) for n in range(1, 8)] + [_message(8, acknowledged=False)]
    delivered = {
        messages[0].customer: [_answer(1, at=2.5)],  # answered once
        messages[1].customer: [Delivery(1.0, HOLD), _answer(2)],  # held, then answered
        messages[2].customer: [_answer(3), _answer(3)],  # doubled
        messages[3].customer: [Delivery(1.0, HOLD)],  # held, never answered: lost
        messages[5].customer: [_answer(1)],  # someone else's answer
        messages[6].customer: [_answer(7), Delivery(2.0, HOLD)],  # told to hold on too late
    }
    result = tally("example", messages, delivered)
    assert (result.sent, result.acknowledged) == (8, 7)
    assert result.answered_once == 4  # 1, 2, 6 (misdirected, counted below) and 7
    assert (result.lost, result.doubled, result.misdirected) == (2, 1, 1)  # 4 and 5 lost
    assert (result.held, result.held_twice, result.held_late) == (3, 0, 1)
    assert result.wait(0) == 1.0
    assert not result.clean
    assert any("not acknowledged" in line for line in result.problems)


def test_one_answer_and_at_most_one_holding_message_before_it_is_clean() -> None:
    messages = [_message(1), _message(2)]
    delivered = {
        messages[0].customer: [Delivery(0.5, HOLD), _answer(1, at=3.0)],
        messages[1].customer: [_answer(2, at=0.2)],
    }
    result = tally("example", messages, delivered)
    assert result.clean, result.describe()
    assert (result.answered_once, result.held) == (2, 1)
    assert sorted(result.waits) == [0.2, 3.0]


def test_the_fake_model_answers_about_the_reference_it_was_asked() -> None:
    body = {
        "messages": [
            {"role": "system", "content": "Sources: ref-000001"},
            {"role": "user", "content": "Shipping? My reference is ref-000042."},
        ]
    }
    assert "ref-000042" in answer_for(body)
    assert "ref-000001" not in answer_for(body)
