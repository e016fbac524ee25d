"""The webhooks of a `parley serve` process, which its workers give way to while one waits."""

from __future__ import annotations

import time

import pytest

from gateway.intake import IntakeGauge


def test_behind_only_while_a_webhook_has_waited_longer_than_the_patience() -> None:
    gauge = IntakeGauge(patience=0.05)
    assert not gauge.behind()
    with gauge.arrived():
        assert not gauge.behind()  # just arrived
        time.sleep(0.06)
        assert gauge.behind()
        with gauge.arrived():  # a newer one does not hide the one waiting
            assert gauge.behind()
    assert not gauge.behind()  # answered: nothing waits


def test_a_webhook_that_failed_no_longer_counts() -> None:
    gauge = IntakeGauge(patience=0.0)
    with pytest.raises(ValueError, match="refused"), gauge.arrived():
        raise ValueError("refused")
    assert not gauge.behind()
