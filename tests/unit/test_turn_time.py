"""How long the slowest turn may take follows the model's timeouts as configured."""

from __future__ import annotations

from core.answer.gates import MAX_DRAFTS
from core.jobs.turn_time import OWN_WORK, longest_turn
from core.settings import Settings


def test_the_slowest_turn_follows_the_configured_model_timeouts() -> None:
    hosted = Settings(_env_file=None, llm_api_key="sk-test")  # type: ignore[call-arg]
    assert longest_turn(hosted, voice=False) == OWN_WORK + 1.5 + MAX_DRAFTS * 90.0
    local = Settings(  # type: ignore[call-arg]
        _env_file=None,
        llm_base_url="http://127.0.0.1:8081/v1",
        llm_answer_timeout_seconds=600,
        llm_rewrite_timeout_seconds=30,
        translate_model="qwen2.5:3b",
        llm_translate_timeout_seconds=45,
        critic_model="qwen2.5:7b",
        llm_critic_timeout_seconds=180,
    )
    # Rewrite and translation one after the other, then each draft with its critic's verdict.
    assert longest_turn(local, voice=False) == OWN_WORK + 30 + 45 + MAX_DRAFTS * (600 + 180)
    assert longest_turn(Settings(_env_file=None), voice=False) == OWN_WORK  # type: ignore[call-arg]
