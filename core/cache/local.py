"""An in-process cache with Redis' semantics, for a single process without a Redis server."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field

from core.ports import BucketResult


@dataclass(slots=True)
class _Entry:
    value: str | list[str] | tuple[float, float]
    expires_at: float | None = None


@dataclass
class LocalCache:
    """Dict-backed cache; expired keys are dropped when touched and swept on writes."""

    clock: Callable[[], float] = time.monotonic
    kind: str = "local"
    _data: dict[str, _Entry] = field(default_factory=dict)
    _writes: int = 0

    def _live(self, key: str) -> _Entry | None:
        entry = self._data.get(key)
        if entry is not None and entry.expires_at is not None and entry.expires_at <= self.clock():
            del self._data[key]
            return None
        return entry

    def _expiry(self, ttl: float | None) -> float | None:
        return None if ttl is None else self.clock() + ttl

    def _put(self, key: str, entry: _Entry) -> None:
        self._data[key] = entry
        self._writes += 1
        if self._writes % 1024 == 0:
            now = self.clock()
            expired = [k for k, e in self._data.items() if e.expires_at and e.expires_at <= now]
            for k in expired:
                del self._data[k]

    async def get(self, key: str) -> str | None:
        entry = self._live(key)
        if entry is None:
            return None
        if not isinstance(entry.value, str):
            raise TypeError(f"cache key {key!r} does not hold a string")
        return entry.value

    async def set(
        self, key: str, value: str, ttl: float | None = None, *, only_if_absent: bool = False
    ) -> bool:
        if only_if_absent and self._live(key) is not None:
            return False
        self._put(key, _Entry(value, self._expiry(ttl)))
        return True

    async def delete(self, *keys: str) -> int:
        removed = 0
        for key in keys:
            if self._live(key) is not None:
                del self._data[key]
                removed += 1
        return removed

    async def incr(self, key: str, amount: int = 1, ttl: float | None = None) -> int:
        entry = self._live(key)
        if entry is None:
            self._put(key, _Entry(str(amount), self._expiry(ttl)))
            return amount
        if not isinstance(entry.value, str):
            raise TypeError(f"cache key {key!r} does not hold a number")
        value = int(entry.value) + amount
        entry.value = str(value)
        return value

    async def take_token(
        self, key: str, *, rate: float, capacity: float, cost: float = 1.0
    ) -> BucketResult:
        now = self.clock()
        entry = self._live(key)
        tokens, stamp = entry.value if entry and isinstance(entry.value, tuple) else (capacity, now)
        tokens = min(capacity, tokens + max(0.0, now - stamp) * rate)
        allowed = tokens >= cost
        retry_after = 0.0 if allowed else (cost - tokens) / rate
        if allowed:
            tokens -= cost
        # Same idle expiry as the Redis script: a full bucket needs no state.
        self._put(key, _Entry((tokens, now), now + capacity / rate + 1.0))
        return BucketResult(allowed=allowed, remaining=tokens, retry_after=retry_after)

    async def list_push(self, key: str, *values: str, keep: int, ttl: float | None) -> None:
        entry = self._live(key)
        items = list(entry.value) if entry and isinstance(entry.value, list) else []
        items.extend(values)
        kept = items[-keep:] if keep > 0 else []
        if kept:
            self._put(key, _Entry(kept, self._expiry(ttl)))
        else:  # Redis has no empty lists: the key is gone
            self._data.pop(key, None)

    async def list_range(self, key: str) -> list[str]:
        entry = self._live(key)
        if entry is None:
            return []
        if not isinstance(entry.value, list):
            raise TypeError(f"cache key {key!r} does not hold a list")
        return list(entry.value)

    async def ping(self) -> None:
        return None

    async def close(self) -> None:
        self._data.clear()
