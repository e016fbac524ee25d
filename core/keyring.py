"""Channel secrets sealed for storage: Fernet encryption under keys from the environment.

A sealed secret is stored in place of the secret as a small JSON object::

    {"enc": "fernet", "kid": "3f9c0a1b2d4e", "token": "gAAAAAB..."}

``kid`` names the key it was sealed with (12 hex digits of the key's SHA-256, which tell
nothing about the key), so a value sealed under a key that is no longer configured is
reported as exactly that, and `parley secrets rotate` knows which values are behind. Fernet
(AES-128-CBC with HMAC-SHA256) authenticates: a token altered in the database is refused,
never decrypted into something else.

`SecretsKeyMissing` (a `Conflict`) and `SecretUnreadable` (a `ConfigError`) are in the tree
of core/errors.py; neither message ever holds a secret or a key.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Mapping
from functools import lru_cache
from typing import Any, TypeGuard

from cryptography.fernet import Fernet, InvalidToken
from pydantic import SecretStr

from core.errors import ConfigError, Conflict
from core.settings import Settings

SCHEME = "fernet"
KEY_SETTING = "PARLEY_SECRETS_KEY"
OLD_KEYS_SETTING = "PARLEY_SECRETS_OLD_KEYS"


class SecretsKeyMissing(Conflict):
    """A secret cannot be stored in clear: the request is fine, the server lacks the key."""

    code = "secrets_key_missing"

    def __init__(self, what: str) -> None:
        super().__init__(
            f"cannot store {what}: {KEY_SETTING} is not set, and channel secrets are only "
            "stored encrypted (`parley secrets new-key` makes a key)"
        )


class SecretUnreadable(ConfigError):
    code = "secret_unreadable"


def new_key() -> str:
    """A fresh random key for PARLEY_SECRETS_KEY."""
    return Fernet.generate_key().decode("ascii")


def key_id(key: str) -> str:
    return hashlib.sha256(key.encode("ascii")).hexdigest()[:12]


def is_sealed(value: object) -> TypeGuard[Mapping[str, Any]]:
    return isinstance(value, Mapping) and value.get("enc") == SCHEME


class Keyring:
    """The current key, which seals, and earlier ones, which only open what they sealed."""

    def __init__(self, current: str | None = None, old: Iterable[str] = ()) -> None:
        self._fernets: dict[str, Fernet] = {}
        for key in (current, *old):
            if key:
                try:
                    self._fernets[key_id(key)] = Fernet(key)
                except ValueError:
                    raise ConfigError(
                        f"{KEY_SETTING} / {OLD_KEYS_SETTING}: a key is not 32 url-safe "
                        "base64 bytes (`parley secrets new-key` makes one)"
                    ) from None
        self.current_id = key_id(current) if current else None

    @classmethod
    def from_settings(cls, settings: Settings) -> Keyring:
        current = settings.secrets_key.get_secret_value() if settings.secrets_key else None
        old = tuple(key.get_secret_value() for key in settings.secrets_old_keys)
        return _keyring(current, old)

    def seal(self, secret: str, *, what: str) -> dict[str, str]:
        """``secret`` encrypted under the current key; `SecretsKeyMissing` without one."""
        if self.current_id is None:
            raise SecretsKeyMissing(what)
        token = self._fernets[self.current_id].encrypt(secret.encode("utf-8"))
        return {"enc": SCHEME, "kid": self.current_id, "token": token.decode("ascii")}

    def open(self, sealed: Mapping[str, Any], *, what: str) -> SecretStr:
        """The secret a `seal` made; `SecretUnreadable` if no key here made it, or if it was
        altered since. ``what`` names the value in the error message."""
        kid, token = sealed.get("kid"), sealed.get("token")
        if sealed.get("enc") != SCHEME or not isinstance(kid, str) or not isinstance(token, str):
            raise SecretUnreadable(f"{what} is not a sealed value Parley can read")
        fernet = self._fernets.get(kid)
        if fernet is None:
            configured = ", ".join(self._fernets) or "none"
            raise SecretUnreadable(
                f"{what} is encrypted with key {kid}, which is neither {KEY_SETTING} nor in "
                f"{OLD_KEYS_SETTING} (configured keys: {configured})"
            )
        try:
            return SecretStr(fernet.decrypt(token.encode("ascii")).decode("utf-8"))
        except (InvalidToken, UnicodeError):
            raise SecretUnreadable(
                f"{what} does not decrypt with key {kid}: the stored value was altered"
            ) from None

    def reseal(self, value: str | Mapping[str, Any], *, what: str) -> dict[str, str] | None:
        """``value`` (in clear, or sealed under any key here) sealed under the current key,
        or None when it already is. A value sealed under the current key is opened all the
        same, so an altered one is found now rather than at a customer's message."""
        if self.current_id is None:
            raise SecretsKeyMissing(what)
        if isinstance(value, str):
            return self.seal(value, what=what)
        secret = self.open(value, what=what)
        if value.get("kid") == self.current_id:
            return None
        return self.seal(secret.get_secret_value(), what=what)


@lru_cache(maxsize=8)
def _keyring(current: str | None, old: tuple[str, ...]) -> Keyring:
    # Every webhook opens its agent's secret: the keys are parsed once per configuration.
    return Keyring(current, old)
