"""Endpoints, retries and backoff.

A Pool holds one httpx.AsyncClient per endpoint. ``call`` sends one request to the healthy
endpoint with the fewest requests in flight; a connection error, a timeout, a 408/429/5xx or a
2xx body that is not the JSON the flavour needs is retried (on another endpoint when there is
one) after an exponential backoff, and the endpoint is rested for that backoff. Other 4xx
answers are not retried: the request itself is wrong (a prompt longer than the context, say).
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, TypeVar

import httpx

T = TypeVar("T")

RETRY_STATUS = {408, 425, 429, 500, 502, 503, 504}


class RequestFailed(RuntimeError):
    """A request that failed for good: retries exhausted, or a 4xx answer."""

    def __init__(self, message: str, attempts: int, retryable: bool):
        super().__init__(message)
        self.attempts = attempts
        self.retryable = retryable


class _Retry(Exception):
    pass


@dataclass
class Endpoint:
    url: str
    client: httpx.AsyncClient
    in_flight: int = 0
    rest_until: float = 0.0
    failures: int = 0


class Pool:
    def __init__(self, urls: List[str], timeout: float, retries: int, backoff: float,
                 max_backoff: float, concurrency: int):
        if not urls:
            raise ValueError("--endpoint: give at least one server URL")
        limits = httpx.Limits(max_connections=max(1, concurrency),
                              max_keepalive_connections=max(1, concurrency))
        self.endpoints = [
            Endpoint(u.rstrip("/"), httpx.AsyncClient(base_url=u.rstrip("/"),
                                                      timeout=httpx.Timeout(timeout),
                                                      limits=limits, trust_env=False))
            for u in urls
        ]
        self.retries = retries
        self.backoff = backoff
        self.max_backoff = max_backoff
        self._rr = 0

    async def aclose(self):
        for e in self.endpoints:
            await e.client.aclose()

    def pick(self, avoid: Optional[Endpoint] = None) -> Endpoint:
        """The ready endpoint with the fewest requests in flight (round robin among ties)."""
        return self._pick(avoid)

    def _pick(self, avoid: Optional[Endpoint]) -> Endpoint:
        now = time.monotonic()
        ready = [e for e in self.endpoints if e.rest_until <= now]
        if len(ready) > 1 and avoid in ready:
            ready.remove(avoid)
        if not ready:
            ready = [min(self.endpoints, key=lambda e: e.rest_until)]
        self._rr += 1
        n = len(ready)
        # Fewest in flight; ties broken round robin so that the load spreads.
        return min((ready[(self._rr + i) % n] for i in range(n)), key=lambda e: e.in_flight)

    async def call(self, method: str, path: str, body: Optional[dict],
                   parse: Callable[[Any], T], endpoint: Optional[Endpoint] = None,
                   what: str = "request", prefer: Optional[Endpoint] = None
                   ) -> "tuple[T, Endpoint, int]":
        """Sends the request to `endpoint` only when given, else first to `prefer` (when it is
        not resting) and then to chosen ones, retrying as described above; returns (parsed
        value, endpoint, attempts)."""
        last = ""
        ep = None
        for attempt in range(1, self.retries + 2):
            if endpoint is not None:
                ep = endpoint
            elif attempt == 1 and prefer is not None and prefer.rest_until <= time.monotonic():
                ep = prefer
            else:
                ep = self._pick(ep)
            wait = ep.rest_until - time.monotonic()
            if wait > 0:
                await asyncio.sleep(wait)
            ep.in_flight += 1
            try:
                try:
                    if method == "GET":
                        r = await ep.client.get(path)
                    else:
                        r = await ep.client.post(path, json=body)
                except httpx.TimeoutException as e:
                    raise _Retry(f"{ep.url}{path}: timed out ({type(e).__name__})")
                except httpx.HTTPError as e:
                    raise _Retry(f"{ep.url}{path}: {type(e).__name__}: {e}")
                if r.status_code in RETRY_STATUS:
                    raise _Retry(f"{ep.url}{path}: HTTP {r.status_code}: {r.text[:200]}")
                if r.status_code >= 400:
                    raise RequestFailed(f"{ep.url}{path}: HTTP {r.status_code}: {r.text[:300]}",
                                        attempt, retryable=False)
                try:
                    data = json.loads(r.content)
                except (ValueError, UnicodeDecodeError) as e:
                    raise _Retry(f"{ep.url}{path}: malformed JSON ({e}): {r.text[:120]!r}")
                try:
                    value = parse(data)
                except ValueError as e:  # MalformedResponse included
                    raise _Retry(f"{ep.url}{path}: unusable answer: {e}")
                ep.failures = 0
                return value, ep, attempt
            except _Retry as e:
                last = str(e)
                ep.failures += 1
                delay = min(self.max_backoff, self.backoff * (2 ** (attempt - 1)))
                delay *= 0.5 + 0.5 * random.random()
                ep.rest_until = max(ep.rest_until, time.monotonic() + delay)
                if attempt <= self.retries and (endpoint is not None or
                                                len(self.endpoints) == 1):
                    await asyncio.sleep(delay)
            finally:
                ep.in_flight -= 1
        raise RequestFailed(f"{what} failed after {self.retries + 1} attempts; last: {last}",
                            self.retries + 1, retryable=True)
