"""The rate-limit counters on Redis (``REDIS_URL``), shared by every control-plane replica.

Admission is one Lua script (atomic, one round trip): it refuses while a token window is at
its limit or the in-flight leases (a sorted set scored by expiry) fill the concurrency limit,
then counts the request in its minute window and refuses past the limit, then takes the lease.
Keys under ``phalanx:limits:``, each expiring with its window. No Django here.
"""

from __future__ import annotations

from inference.usage.quotas import Limits

PREFIX = "phalanx:limits:"
ORDER = ("requests_per_minute", "tokens_per_minute", "tokens_per_day", "concurrent_sessions")

ADMIT = """
local function limit(i) return tonumber(ARGV[i]) or 0 end
if limit(2) > 0 and (tonumber(redis.call('GET', KEYS[2])) or 0) >= limit(2) then return 2 end
if limit(3) > 0 and (tonumber(redis.call('GET', KEYS[3])) or 0) >= limit(3) then return 3 end
if limit(4) > 0 then
  redis.call('ZREMRANGEBYSCORE', KEYS[4], '-inf', ARGV[5])
  if redis.call('ZCARD', KEYS[4]) >= limit(4) then return 4 end
end
if limit(1) > 0 then
  local n = redis.call('INCR', KEYS[1])
  if n == 1 then redis.call('EXPIRE', KEYS[1], 120) end
  if n > limit(1) then return 1 end
end
if limit(4) > 0 then
  redis.call('ZADD', KEYS[4], ARGV[7], ARGV[6])
  redis.call('EXPIRE', KEYS[4], ARGV[8])
end
return 0
"""


class RedisLimitStore:
    """``limits.LimitStore`` on the Redis at ``url``."""

    def __init__(self, url: str, prefix: str = PREFIX) -> None:
        import redis

        self.redis = redis.Redis.from_url(url, socket_timeout=1.0, socket_connect_timeout=1.0)
        self.prefix = prefix
        self._admit = self.redis.register_script(ADMIT)

    def admit(self, keys: dict[str, str], limits: Limits, now: float, lease: str | None) -> str:
        from inference.usage.limits import LEASE_S

        args = [getattr(limits, name) or 0 for name in ORDER]
        hit = self._admit(
            keys=[self.prefix + keys[name] for name in ORDER],
            args=[*args, now, lease or "", now + LEASE_S, LEASE_S],
        )
        return ORDER[int(hit) - 1] if int(hit) else ""

    def settle(self, keys: dict[str, str], tokens: int, lease: str | None) -> None:
        from inference.usage.limits import DAY_S

        pipe = self.redis.pipeline(transaction=False)
        if tokens:
            for name, ttl in (("tokens_per_minute", 120), ("tokens_per_day", DAY_S + 60)):
                pipe.incrby(self.prefix + keys[name], tokens)
                pipe.expire(self.prefix + keys[name], ttl)
        if lease:
            pipe.zrem(self.prefix + keys["concurrent_sessions"], lease)
        pipe.execute()

    def ready(self, keys: dict[str, str]) -> bool:
        return True  # one round trip, made on the event loop

    def counts(self, keys: dict[str, str], now: float) -> dict[str, int]:
        pipe = self.redis.pipeline(transaction=False)
        for name in ORDER[:3]:
            pipe.get(self.prefix + keys[name])
        pipe.zcount(self.prefix + keys["concurrent_sessions"], now, "+inf")
        values = pipe.execute()
        return {name: int(value or 0) for name, value in zip(ORDER, values, strict=True)}

    def clear(self) -> None:
        """Drop every counter (tests)."""
        for key in self.redis.scan_iter(match=self.prefix + "*"):
            self.redis.delete(key)
