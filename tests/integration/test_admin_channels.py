"""The channel registry on the admin side: every channel's credentials in the API, OpenAPI and
the console, as declared; conversations by channel name; customers shown by name.

Nothing here names a channel but through the registry, so a channel added to it is covered.
"""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import aiohttp
import asyncpg
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from markupsafe import escape

from channels.registry import CHANNELS, channel_names
from core.store import Agent, Agents
from core.store.conversations import Conversations, TurnRecord
from core.store.vector_index import EmbedderIdentity
from gateway.admin import schemas
from gateway.app import create_app
from gateway.keys import DATABASE, EMBEDDER
from tests.conftest import MakeSettings
from tests.support.console import form_token_of

Client = TestClient[web.Request, web.Application]

TOKEN = "admin-token-for-channel-tests-0123456789"
ADMIN = "/api/v1/admin"


@dataclass
class Gateway:
    browser: Client  # signed in to the console (a session cookie)
    api: aiohttp.ClientSession  # the admin API with the token, no cookies
    pool: asyncpg.Pool
    agent: Agent

    async def call(self, method: str, path: str, **kwargs: Any) -> tuple[int, Any]:
        async with self.api.request(method, self.browser.make_url(ADMIN + path), **kwargs) as r:
            return r.status, await r.json()

    async def page(self, path: str) -> str:
        response = await self.browser.get(path, allow_redirects=False)
        text = await response.text()
        assert response.status == 200, text
        return text


@pytest.fixture
async def gateway(make_settings: MakeSettings) -> AsyncIterator[Gateway]:
    browser: Client = TestClient(TestServer(create_app(make_settings(admin_token=TOKEN))))
    await browser.start_server()
    app = browser.server.app
    pool = app[DATABASE].pool
    agent = await Agents(pool).create(
        "shop", embedder=EmbedderIdentity.of(app[EMBEDDER]), name="The Shop"
    )
    sign_in = await browser.get("/admin/sign-in")
    signed_in = await browser.post(
        "/admin/sign-in",
        data={"form_token": form_token_of(await sign_in.text()), "token": TOKEN},
        allow_redirects=False,
    )
    assert signed_in.status == 303
    api = aiohttp.ClientSession(
        headers={"Authorization": f"Bearer {TOKEN}"}, cookie_jar=aiohttp.DummyCookieJar()
    )
    yield Gateway(browser, api, pool, agent)
    await api.close()
    await browser.close()


# -- credentials, from each channel's declaration -------------------------------------------


def _resolve(document: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """A schema with its $ref followed, and of an optional one the part that is not null."""
    for option in schema.get("anyOf", [schema]):
        if option.get("type") == "null":
            continue
        if "$ref" in option:
            found: dict[str, Any] = document["components"]["schemas"][option["$ref"].split("/")[-1]]
            return found
        return dict(option)
    raise AssertionError(f"no schema but null in {schema}")


async def test_every_channel_has_its_declared_credentials_in_api_openapi_and_console(
    gateway: Gateway,
) -> None:
    status, agent = await gateway.call("GET", "/agents/shop")
    assert status == 200
    assert set(agent["channels"]) == {c.block for c in CHANNELS}
    async with gateway.api.get(gateway.browser.make_url("/api/v1/openapi.json")) as response:
        document = await response.json()
    patch_op = document["paths"]["/api/v1/admin/agents/{agent}"]["patch"]
    agent_patch = _resolve(
        document, patch_op["requestBody"]["content"]["application/json"]["schema"]
    )
    channels_patch = _resolve(document, agent_patch["properties"]["channels"])
    agent_out = _resolve(
        document, patch_op["responses"]["200"]["content"]["application/json"]["schema"]
    )
    channels_out = _resolve(document, agent_out["properties"]["channels"])
    settings_page = await gateway.page("/admin/agents/shop/settings")

    for channel in CHANNELS:
        block, fields = channel.block, channel.credential_fields
        shown_names = {f"{f.name}_set" if f.secret else f.name for f in fields}
        # A channel with a customer window (WhatsApp) has the agent's approved templates too.
        options = {"templates"} if channel.customer_window_hours is not None else set()
        # The models the API validates and answers with.
        assert set(schemas.CHANNEL_OUT[block].model_fields) == {
            "configured",
            *shown_names,
            *options,
        }
        assert set(schemas.CHANNEL_PATCH[block].model_fields) == {f.name for f in fields} | options
        # What an agent without credentials of its own shows: no value, no secret set.
        assert agent["channels"][block] == {
            "configured": False,
            **{
                f"{f.name}_set" if f.secret else f.name: False if f.secret else None for f in fields
            },
            **{option: [] for option in options},
        }

        # OpenAPI: the block in what is sent and what comes back, and the channel's webhooks.
        out = _resolve(document, channels_out["properties"][block])
        assert set(out["properties"]) == {"configured", *shown_names, *options}
        patch = _resolve(document, channels_patch["properties"][block])
        assert set(patch["properties"]) == {f.name for f in fields} | options
        assert patch["additionalProperties"] is False
        for spec in fields:
            prop = patch["properties"][spec.name]
            assert prop.get("writeOnly", False) is spec.secret, (block, spec.name)
            assert spec.label in prop["description"]
            value = _resolve(document, prop)
            assert value["type"] == "string"
            if spec.pattern is not None:
                assert value["pattern"] == f"^(?:{spec.pattern})$"
        for hook in channel.webhooks:
            operation = document["paths"][hook.path][hook.method]
            assert operation["operationId"] == hook.operation_id
            assert operation["summary"] == hook.summary
            if hook.content_type is not None:
                assert hook.content_type in operation["requestBody"]["content"]

        # The console: a labelled input for each field, secrets as password inputs.
        legend = f"<legend>{escape(channel.title)}</legend>"
        assert legend in settings_page, channel.title
        for spec in fields:
            name = f"{block}_{spec.name}"
            field = re.search(
                rf'<label for="f-{name}">(.*?)</label>\s*<input ([^>]*)>', settings_page
            )
            assert field is not None, name
            assert escape(spec.label) in field.group(1)
            assert f'name="{name}"' in field.group(2)
            kind = "password" if spec.secret else "text"
            assert f'type="{kind}"' in field.group(2), name
            if spec.secret:
                assert f'data-secret="{name}">not set<' in settings_page
                assert 'value=""' in field.group(2)
            if spec.help:
                helped = spec.help[:1].upper() + spec.help[1:]
                assert escape(helped) in settings_page, name


async def test_a_block_without_a_required_field_or_with_a_wrong_type_is_refused(
    gateway: Gateway,
) -> None:
    for channel in CHANNELS:
        required = [f.name for f in channel.credential_fields if f.required]
        status, body = await gateway.call(
            "PATCH", "/agents/shop", json={"channels": {channel.block: {}}}
        )
        if required:
            assert status == 400, body
            assert f"channels.{channel.block}.{required[0]}" in body["error"]["message"]
        else:
            assert status == 200, body
            assert body["channels"][channel.block]["configured"] is True
            status, body = await gateway.call(
                "PATCH", "/agents/shop", json={"channels": {channel.block: None}}
            )
            assert body["channels"][channel.block]["configured"] is False
        for spec in channel.credential_fields:
            status, body = await gateway.call(
                "PATCH", "/agents/shop", json={"channels": {channel.block: {spec.name: 42}}}
            )
            assert status == 400, body
            assert f"channels.{channel.block}.{spec.name}" in body["error"]["message"]
        # Credentials go through channels, never through the other settings.
        status, body = await gateway.call(
            "PATCH", "/agents/shop", json={"settings": {channel.block: {}}}
        )
        assert status == 400, body
    assert (await Agents(gateway.pool).get("shop")).settings == {}


async def test_conversations_are_filtered_by_a_channel_name_of_the_registry(
    gateway: Gateway,
) -> None:
    for name in channel_names():
        status, body = await gateway.call("GET", "/conversations", params={"channel": name})
        assert status == 200, (name, body)
    status, body = await gateway.call("GET", "/conversations", params={"channel": "fax"})
    assert status == 400
    assert "channel" in body["error"]["message"]
    listing = await gateway.page("/admin/conversations")
    for name in channel_names():
        assert f'<option value="{name}"' in listing


# -- customers by name ----------------------------------------------------------------------


async def test_a_customer_is_shown_by_name_else_handle_else_the_channels_id(
    gateway: Gateway,
) -> None:
    conversations = Conversations(gateway.pool)
    agent_id = gateway.agent.id
    messaging = [c.name for c in CHANNELS]
    first, second = messaging[0], messaging[-1]
    named = await conversations.remember_customer(
        agent_id, second, "4242", "Anna de Vries", "anna_dv"
    )
    # A message without a profile name leaves the known one as it is.
    assert await conversations.remember_customer(agent_id, second, "4242", None, None) == named
    assert await conversations.remember_customer(agent_id, second, "4242", "  ", "") == named
    handled = await conversations.remember_customer(agent_id, second, "5151", None, "piet")
    unnamed = await conversations.remember_customer(agent_id, first, "+31600000001", None, None)
    assert len({named, handled, unnamed}) == 3
    # The turn answered after it is in the same conversation, and keeps the name.
    saved = await conversations.save_turn(
        TurnRecord(
            agent_id=agent_id, channel=second, conversation_key="4242", question="Hello?",
            answer="Hi Anna.", save_question=True, rewritten_query=None, confidence=0.9,
            low_confidence=False, mode="extractive", trace={}, language="en",
        )
    )  # fmt: skip
    assert saved.conversation_id == named
    # A later name replaces the earlier one.
    await conversations.remember_customer(agent_id, second, "5151", None, "piet_k")

    status, page = await gateway.call("GET", "/conversations")
    assert status == 200
    listed = {c["id"]: c for c in page["items"]}
    assert set(listed) == {named, handled, unnamed}
    anna = listed[named]
    assert (anna["customer"], anna["customer_name"], anna["customer_handle"]) == (
        "Anna de Vries", "Anna de Vries", "anna_dv",
    )  # fmt: skip
    assert anna["conversation_key"] == "4242"
    piet = listed[handled]
    assert (piet["customer"], piet["customer_name"], piet["customer_handle"]) == (
        "@piet_k", None, "piet_k",
    )  # fmt: skip
    nameless = listed[unnamed]
    assert (nameless["customer"], nameless["customer_name"], nameless["customer_handle"]) == (
        "+31600000001", None, None,
    )  # fmt: skip
    status, detail = await gateway.call("GET", f"/conversations/{named}")
    assert status == 200
    assert detail["conversation"]["customer"] == "Anna de Vries"
    assert detail["conversation"]["customer_name"] == "Anna de Vries"
    assert detail["conversation"]["customer_handle"] == "anna_dv"
    assert [m["text"] for m in detail["messages"]] == ["Hello?", "Hi Anna."]

    listing = await gateway.page("/admin/conversations")
    for conversation_id, shown in ((named, "Anna de Vries"), (handled, "@piet_k"),
                                   (unnamed, "+31600000001")):  # fmt: skip
        assert f'<a href="/admin/conversations/{conversation_id}">{shown}</a>' in listing
    assert ">4242<" not in listing  # the name, not the chat id
    transcript = await gateway.page(f"/admin/conversations/{named}")
    assert "Conversation with Anna de Vries" in transcript
    assert "@anna_dv, 4242" in transcript  # who it is on the channel, beside the name
    assert "Conversation with @piet_k" in await gateway.page(f"/admin/conversations/{handled}")
