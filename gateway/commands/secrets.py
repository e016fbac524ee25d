"""`parley secrets new-key|rotate`: the key agents' channel secrets are encrypted under."""

from __future__ import annotations

import argparse
import asyncio

from channels.registry import secret_fields
from core.errors import ConfigError
from core.keyring import KEY_SETTING, OLD_KEYS_SETTING, Keyring, new_key
from core.settings import Settings
from core.store import Agents, open_database
from core.store.agents import Resealed


def register(commands: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    secrets = commands.add_parser(
        "secrets", help="the key agents' channel secrets are stored encrypted under"
    )
    actions = secrets.add_subparsers(dest="action", metavar="ACTION", required=True)
    actions.add_parser("new-key", help=f"print a new random key for {KEY_SETTING}")
    actions.add_parser(
        "rotate",
        help=f"encrypt every stored channel secret under {KEY_SETTING} (those stored in clear "
        f"and those under a key of {OLD_KEYS_SETTING}), in one transaction",
    )


def run(args: argparse.Namespace, settings: Settings) -> int:
    if args.action == "new-key":
        print(new_key())
        return 0
    keyring = Keyring.from_settings(settings)
    if keyring.current_id is None:
        raise ConfigError(
            f"{KEY_SETTING} is not set: set it to the key to encrypt under "
            "(`parley secrets new-key` makes one), and the earlier key, if any, in "
            f"{OLD_KEYS_SETTING}"
        )
    done = asyncio.run(_rotate(settings, keyring))
    print(_report(done, old_keys=bool(settings.secrets_old_keys)))
    return 0


async def _rotate(settings: Settings, keyring: Keyring) -> Resealed:
    database = await open_database(settings, max_size=1)
    try:
        return await Agents(database.pool).reseal_secrets(keyring, secret_fields())
    finally:
        await database.close()


def _report(done: Resealed, *, old_keys: bool) -> str:
    if done.resealed:
        clear = f" ({done.were_clear} of them stored in clear)" if done.were_clear else ""
        lines = [
            f"re-encrypted {done.resealed} channel secret(s) of {done.agents} agent(s) under "
            f"key {done.key_id}{clear}"
        ]
    else:
        lines = ["nothing to re-encrypt"]
    lines.append(f"{done.total} channel secret(s) stored, all under key {done.key_id}")
    if old_keys:
        lines.append(f"{OLD_KEYS_SETTING} is no longer needed by what is stored")
    return "\n".join(lines)
