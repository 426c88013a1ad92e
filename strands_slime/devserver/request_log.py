"""The request log behind ``GET /dev/requests`` and ``DevServer.request_log`` (a test hook)."""

from __future__ import annotations

import collections
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

REDACTED_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


def redacted_headers(request: web.Request) -> dict[str, str]:
    """The request's headers with credentials replaced by ``<redacted>``."""
    return {
        name: ("<redacted>" if name.lower() in REDACTED_HEADERS else value)
        for name, value in request.headers.items()
    }


@dataclass(slots=True)
class LoggedRequest:
    """One ``/generate`` request as received: headers, raw body, reply status, injected fault and (when
    recorded) the reply body."""

    headers: dict[str, str]
    raw: bytes = b""
    status: int | None = None
    evicted: bool = False
    received: float = field(default_factory=time.time)
    fault: str | None = None
    reply: bytes | None = None

    def as_dict(self) -> dict[str, Any]:
        """``{"json", "headers", "status", "time"}`` (plus ``"fault"``, ``"reply"``): decoded now."""
        try:
            body = json.loads(self.raw) if self.raw else None
        except ValueError:
            body = None
        entry = {"json": body, "headers": self.headers, "status": self.status, "time": self.received}
        if self.fault is not None:
            entry["fault"] = self.fault
        if self.reply is not None:
            try:
                entry["reply"] = json.loads(self.reply)
            except ValueError:
                entry["reply"] = self.reply.decode(errors="replace")
        return entry


class RequestLog:
    """The last ``max_entries`` ``/generate`` requests, also capped by body bytes.

    Bodies are kept as raw bytes and decoded when read: a parsed 5k-token prompt costs ~36 bytes per
    token in Python objects, which long benchmarks cannot afford ten thousand times.
    """

    def __init__(self, max_entries: int, max_bytes: int = 256 * 1024 * 1024) -> None:
        """Keep at most ``max_entries`` requests and ``max_bytes`` of bodies (the oldest go first)."""
        self.max_entries = max_entries
        self.max_bytes = max_bytes
        self._entries: collections.deque[LoggedRequest] = collections.deque()
        self._bytes = 0

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, headers: dict[str, str]) -> LoggedRequest:
        """Log a request as it arrives (its body follows with :meth:`set_body`)."""
        entry = LoggedRequest(headers=headers)
        self._entries.append(entry)
        self._trim()
        return entry

    def set_body(self, entry: LoggedRequest, raw: bytes) -> None:
        """Attach the raw body once read."""
        entry.raw = raw
        if not entry.evicted:
            self._bytes += len(raw)
            self._trim()

    def _trim(self) -> None:
        while len(self._entries) > self.max_entries or (
            self._bytes > self.max_bytes and len(self._entries) > 1
        ):
            oldest = self._entries.popleft()
            oldest.evicted = True
            self._bytes -= len(oldest.raw)

    def entries(self) -> list[dict[str, Any]]:
        """Every kept request, oldest first, as :meth:`LoggedRequest.as_dict`."""
        return [entry.as_dict() for entry in self._entries]

    def clear(self) -> int:
        """Forget every request; returns how many there were."""
        count = len(self._entries)
        for entry in self._entries:
            entry.evicted = True
        self._entries.clear()
        self._bytes = 0
        return count
