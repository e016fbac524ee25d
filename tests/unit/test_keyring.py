"""Sealing channel secrets: round trips, key ids, altered values, rotation, refusals."""

from __future__ import annotations

import pytest

from core.errors import ConfigError
from core.keyring import Keyring, SecretsKeyMissing, SecretUnreadable, is_sealed, key_id, new_key
from core.settings import load_settings

KEY, OTHER = new_key(), new_key()
SECRET = "twilio-auth-token-0123456789abcdef"


def test_a_sealed_secret_opens_again_and_shows_nothing_of_itself() -> None:
    keyring = Keyring(KEY)
    sealed = keyring.seal(SECRET, what="settings.twilio.auth_token")
    assert is_sealed(sealed)
    assert (sealed["enc"], sealed["kid"]) == ("fernet", key_id(KEY))
    assert SECRET not in str(sealed)
    assert keyring.open(sealed, what="x").get_secret_value() == SECRET
    # Each sealing is fresh, so equal secrets do not show as equal in the database.
    assert keyring.seal(SECRET, what="x")["token"] != sealed["token"]


def test_key_ids_name_keys_without_telling_them() -> None:
    assert key_id(KEY) != key_id(OTHER)
    assert len(key_id(KEY)) == 12
    assert key_id(KEY) not in KEY


def test_old_keys_open_but_only_the_current_one_seals() -> None:
    sealed = Keyring(OTHER).seal(SECRET, what="x")
    keyring = Keyring(KEY, [OTHER])
    assert keyring.open(sealed, what="x").get_secret_value() == SECRET
    assert keyring.seal(SECRET, what="x")["kid"] == key_id(KEY)


def test_a_missing_key_and_an_altered_value_are_told_apart() -> None:
    sealed = Keyring(OTHER).seal(SECRET, what="x")
    with pytest.raises(SecretUnreadable) as missing:
        Keyring(KEY).open(sealed, what="settings.telegram.bot_token")
    assert f"settings.telegram.bot_token is encrypted with key {key_id(OTHER)}" in str(
        missing.value
    )
    assert f"configured keys: {key_id(KEY)}" in str(missing.value)
    with pytest.raises(SecretUnreadable, match="configured keys: none"):
        Keyring().open(sealed, what="x")

    token = sealed["token"]
    altered = {**sealed, "token": token[:20] + ("A" if token[20] != "A" else "B") + token[21:]}
    with pytest.raises(SecretUnreadable, match="the stored value was altered"):
        Keyring(OTHER).open(altered, what="x")
    # Another key's token under this key's id: no key here made it.
    forged = {**Keyring(KEY).seal(SECRET, what="x"), "kid": key_id(OTHER)}
    with pytest.raises(SecretUnreadable, match="altered"):
        Keyring(OTHER).open(forged, what="x")
    with pytest.raises(SecretUnreadable, match="not a sealed value"):
        Keyring(KEY).open({"enc": "fernet", "kid": key_id(KEY)}, what="x")


def test_reseal_moves_clear_and_old_values_to_the_current_key_only() -> None:
    keyring = Keyring(KEY, [OTHER])
    current = keyring.seal(SECRET, what="x")
    assert keyring.reseal(current, what="x") is None
    for value in (SECRET, Keyring(OTHER).seal(SECRET, what="x")):
        moved = keyring.reseal(value, what="x")
        assert moved is not None
        assert moved["kid"] == key_id(KEY)
        assert keyring.open(moved, what="x").get_secret_value() == SECRET


def test_nothing_is_sealed_without_a_key() -> None:
    with pytest.raises(SecretsKeyMissing, match=r"cannot store settings\.x: PARLEY_SECRETS_KEY"):
        Keyring(None, [OTHER]).seal(SECRET, what="settings.x")
    with pytest.raises(SecretsKeyMissing):
        Keyring().reseal(SECRET, what="x")


def test_keys_from_the_settings_are_checked_and_never_echoed() -> None:
    settings = load_settings(_env_file=None, secrets_key=KEY, secrets_old_keys=f"{OTHER}, ")
    keyring = Keyring.from_settings(settings)
    assert keyring.current_id == key_id(KEY)
    assert keyring.open(Keyring(OTHER).seal(SECRET, what="x"), what="x").get_secret_value() == (
        SECRET
    )
    assert Keyring.from_settings(load_settings(_env_file=None, secrets_key="")).current_id is None
    for field, value in (("secrets_key", "hunter2-hunter2"), ("secrets_old_keys", "abc,def")):
        with pytest.raises(ConfigError) as refused:
            load_settings(_env_file=None, **{field: value})
        assert "must be a key made by `parley secrets new-key`" in str(refused.value)
        assert value.split(",")[0] not in str(refused.value)
