"""Settings come from the environment and `.env`; a bad value names its variable."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.errors import ConfigError
from core.settings import LlmTimeouts, Settings, load_settings

_OURS = ("PARLEY_", "TWILIO_", "TELEGRAM_", "OPENAI_")


@pytest.fixture(autouse=True)
def clean_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    import os

    for name in list(os.environ):
        if name.startswith(_OURS):
            monkeypatch.delenv(name)
    monkeypatch.chdir(tmp_path)  # no stray .env


def test_defaults_run_on_a_bare_machine() -> None:
    settings = load_settings()
    assert settings.database_url is None  # embedded PostgreSQL
    assert settings.redis_url is None  # in-process cache
    assert (settings.host, settings.port) == ("127.0.0.1", 8080)
    assert settings.data_dir == Path(".parley")
    assert settings.embed_provider == "use"
    assert not settings.llm_configured
    assert settings.twilio_api_base == "https://api.twilio.com"
    assert settings.telegram_api_base == "https://api.telegram.org"


def test_environment_and_vendor_names_are_read(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_PORT", "9090")
    monkeypatch.setenv("PARLEY_DATABASE_URL", "postgresql://u:pw@db:5432/parley")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    monkeypatch.setenv("TWILIO_AUTH_TOKEN", "tw-secret")
    monkeypatch.setenv("TELEGRAM_WEBHOOK_SECRET", "abc_DEF-123" * 3)
    monkeypatch.setenv("PARLEY_TELEGRAM_API_BASE", "http://127.0.0.1:9999/")
    settings = load_settings()
    assert settings.port == 9090
    assert settings.llm_api_key is not None
    assert settings.llm_api_key.get_secret_value() == "sk-test"
    assert settings.llm_configured
    assert settings.twilio_auth_token is not None
    assert settings.twilio_auth_token.get_secret_value() == "tw-secret"
    assert settings.telegram_api_base == "http://127.0.0.1:9999"


def test_messaging_retries_and_the_holding_message(monkeypatch: pytest.MonkeyPatch) -> None:
    defaults = load_settings()
    # Long enough to ride out an hour-long outage, well inside WhatsApp's 24-hour window.
    assert defaults.inbox_retry_hours == 6.0
    assert (defaults.holding_message_seconds, defaults.inbox_stuck_after) == (30.0, 30.0)
    monkeypatch.setenv("PARLEY_INBOX_RETRY_HOURS", "2.5")
    monkeypatch.setenv("PARLEY_HOLDING_MESSAGE_SECONDS", "0")
    changed = load_settings()
    assert changed.inbox_retry_hours == 2.5
    assert changed.holding_message_seconds == 0  # never told; still listed as late after 30 s
    assert changed.inbox_stuck_after == 30.0


def test_the_model_timeouts_default_for_hosted_models_and_are_read_from_the_environment(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert load_settings().llm_timeouts == LlmTimeouts(
        queue=20.0, first_token=20.0, answer=90.0, rewrite=1.5, translate=1.5, summary=8.0,
        critic=8.0,
    )  # fmt: skip
    # What the README recommends for a CPU server with a few slots.
    for name, value in {
        "QUEUE": "300", "FIRST_TOKEN": "120", "ANSWER": "600", "REWRITE": "30",
        "TRANSLATE": "45", "SUMMARY": "120", "CRITIC": "180",
    }.items():  # fmt: skip
        monkeypatch.setenv(f"PARLEY_LLM_{name}_TIMEOUT_SECONDS", value)
    assert load_settings().llm_timeouts == LlmTimeouts(
        queue=300.0, first_token=120.0, answer=600.0, rewrite=30.0, translate=45.0,
        summary=120.0, critic=180.0,
    )  # fmt: skip


def test_the_older_timeout_names_still_count_unless_the_new_ones_are_set(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PARLEY_REWRITE_TIMEOUT_MS", "2500")
    monkeypatch.setenv("PARLEY_SUMMARY_TIMEOUT_MS", "20000")
    monkeypatch.setenv("PARLEY_CRITIC_TIMEOUT_MS", "12000")
    timeouts = load_settings().llm_timeouts
    # The translation keeps following the rewrite, as it did.
    assert (timeouts.rewrite, timeouts.translate) == (2.5, 2.5)
    assert (timeouts.summary, timeouts.critic) == (20.0, 12.0)
    monkeypatch.setenv("PARLEY_LLM_SUMMARY_TIMEOUT_SECONDS", "90")
    assert load_settings().llm_timeouts.summary == 90.0
    assert load_settings(rewrite_timeout_ms=300).llm_timeouts.rewrite == 0.3  # in code too


def test_parley_key_wins_over_openai_key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-openai")
    monkeypatch.setenv("PARLEY_LLM_API_KEY", "sk-parley")
    settings = load_settings()
    assert settings.llm_api_key is not None
    assert settings.llm_api_key.get_secret_value() == "sk-parley"


def test_dotenv_file_is_read(tmp_path: Path) -> None:
    (tmp_path / ".env").write_text("PARLEY_PORT=8181\nPARLEY_LOG_LEVEL=DEBUG\n")
    settings = load_settings()
    assert settings.port == 8181
    assert settings.log_level == "DEBUG"


def test_secrets_never_show_in_repr(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_DATABASE_URL", "postgresql://u:hunter2@db/parley")
    monkeypatch.setenv("PARLEY_ADMIN_TOKEN", "admin-hunter2-0123456789abcdefghijk")
    monkeypatch.setenv("TELEGRAM_BOT_TOKEN", "123:hunter2")
    text = repr(load_settings()) + str(load_settings())
    assert "hunter2" not in text


@pytest.mark.parametrize(
    ("variable", "value", "complaint"),
    [
        ("PARLEY_PORT", "eighty", "valid integer"),
        ("PARLEY_PORT", "70000", "less than or equal to 65535"),
        ("PARLEY_DATABASE_URL", "mysql://localhost/x", "postgresql://"),
        ("PARLEY_REDIS_URL", "localhost:6379", "redis://"),
        ("PARLEY_EMBED_PROVIDER", "word2vec", "'use' or 'openai'"),
        ("PARLEY_LLM_BASE_URL", "api.openai.com", "http:// or https://"),
        ("TELEGRAM_WEBHOOK_SECRET", "has spaces", "A-Z, a-z, 0-9"),
        ("TELEGRAM_WEBHOOK_SECRET", "abc_DEF-123", "at least 32 characters"),
        ("TELEGRAM_WEBHOOK_SECRET", "x" * 31, "at least 32 characters"),
        ("TELEGRAM_WEBHOOK_SECRET", "x" * 257, "at most 256 characters"),
        ("TELEGRAM_WEBHOOK_SECRET", "has spaces and is long enough for it", "A-Z, a-z, 0-9"),
        ("PARLEY_REWRITE_TIMEOUT_MS", "5", "greater than or equal to 50"),
        ("PARLEY_LLM_QUEUE_TIMEOUT_SECONDS", "0", "greater than 0"),
        ("PARLEY_LLM_FIRST_TOKEN_TIMEOUT_SECONDS", "soon", "valid number"),
        ("PARLEY_INBOX_RETRY_HOURS", "30", "less than or equal to 20"),
        ("PARLEY_HOLDING_MESSAGE_SECONDS", "-1", "greater than or equal to 0"),
        ("PARLEY_ADMIN_TOKEN", "admin-hunter2", "at least 32 characters"),
        ("PARLEY_METRICS_TOKEN", "x" * 31, "at least 32 characters"),
    ],
)
def test_a_bad_value_is_one_line_naming_the_variable(
    monkeypatch: pytest.MonkeyPatch, variable: str, value: str, complaint: str
) -> None:
    monkeypatch.setenv(variable, value)
    with pytest.raises(ConfigError) as caught:
        load_settings()
    message = caught.value.message
    assert message.startswith(f"invalid setting {variable}: ")
    assert complaint in message
    assert "\n" not in message


def test_tokens_are_32_characters_or_more_and_never_shown(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("PARLEY_ADMIN_TOKEN", "hunter2-is-too-short")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert caught.value.message.startswith("invalid setting PARLEY_ADMIN_TOKEN: must be at least")
    assert "hunter2" not in caught.value.message
    monkeypatch.setenv("PARLEY_ADMIN_TOKEN", "h" * 32)
    monkeypatch.setenv("PARLEY_METRICS_TOKEN", "m" * 32)
    settings = load_settings()
    assert settings.admin_token is not None
    assert settings.admin_token.get_secret_value() == "h" * 32
    assert settings.metrics_token is not None
    assert settings.metrics_token.get_secret_value() == "m" * 32
    assert load_settings(admin_token=None, metrics_token=None).admin_token is None


def test_several_bad_values_are_all_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PARLEY_PORT", "x")
    monkeypatch.setenv("PARLEY_LOG_LEVEL", "LOUD")
    with pytest.raises(ConfigError) as caught:
        load_settings()
    assert "PARLEY_PORT" in caught.value.message
    assert "PARLEY_LOG_LEVEL" in caught.value.message


def test_settings_can_be_built_in_code() -> None:
    settings = Settings(_env_file=None, port=9000, llm_api_key="k")  # type: ignore[call-arg]
    assert settings.port == 9000
    assert settings.llm_configured
