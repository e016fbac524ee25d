"""The keys a test session writes to a Redis it shares with others (the machine's, or
``PARLEY_REDIS_URL``): all under one prefix of the session's own, deleted when it ends."""

from __future__ import annotations

import uuid

import redis

# Every key of this session starts with it; another session (a run beside this one) has its own.
SESSION_PREFIX = f"parley-test-{uuid.uuid4().hex[:12]}:"


def key_prefix() -> str:
    """A prefix of one test's (or one app's) own, under the session's."""
    return f"{SESSION_PREFIX}{uuid.uuid4().hex[:12]}:"


def session_keys(url: str) -> list[str]:
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        return list(client.scan_iter(match=f"{SESSION_PREFIX}*", count=1000))
    finally:
        client.close()


def delete_session_keys(url: str) -> int:
    """Delete this session's keys; returns how many there were."""
    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        deleted = 0
        batch: list[str] = []
        for key in client.scan_iter(match=f"{SESSION_PREFIX}*", count=1000):
            batch.append(key)
            if len(batch) == 500:
                deleted += client.unlink(*batch)
                batch.clear()
        if batch:
            deleted += client.unlink(*batch)
        return deleted
    finally:
        client.close()
