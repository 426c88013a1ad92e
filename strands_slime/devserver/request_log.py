"""The request log behind ``GET /dev/requests`` and ``DevServer.request_log`` (a test hook)."""

from __future__ import annotations

import collections
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

REDACTED_HEADERS = frozenset({"authorization", "cookie", "proxy-authorization"})


@dataclass(slots=True)
class LoggedRequest:
    """One ``/generate`` request as received: headers, raw body, reply status, and what plugins note
    about it (``notes``: an injected fault, the reply a proxy saw)."""

    headers: dict[str, str]
    raw: bytes
    status: int | None = None
    received: float = field(default_factory=time.time)
    notes: dict[str, Any] = field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        """``{"json", "headers", "status", "time"}`` plus the notes; the body decoded now (None: not JSON)."""
        try:
            body = json.loads(self.raw) if self.raw else None
        except ValueError:
            body = None
        return {
            "json": body,
            "headers": self.headers,
            "status": self.status,
            "time": self.received,
            **self.notes,
        }


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

    def add(self, headers: Mapping[str, str], raw: bytes) -> LoggedRequest:
        """Log a request once its body arrived, credentials in its headers replaced by ``<redacted>``."""
        redacted = {
            name: "<redacted>" if name.lower() in REDACTED_HEADERS else v for name, v in headers.items()
        }
        entry = LoggedRequest(redacted, raw)
        self._entries.append(entry)
        self._bytes += len(raw)
        while len(self._entries) > self.max_entries or (
            self._bytes > self.max_bytes and len(self._entries) > 1
        ):
            self._bytes -= len(self._entries.popleft().raw)
        return entry

    def entries(self) -> list[dict[str, Any]]:
        """Every kept request, oldest first, as :meth:`LoggedRequest.as_dict`."""
        return [entry.as_dict() for entry in self._entries]

    def clear(self) -> int:
        """Forget every request; returns how many there were."""
        count = len(self._entries)
        self._entries.clear()
        self._bytes = 0
        return count
