"""The front end's side of the wire: the zygote's control socket and each execution's pipes.

Everything here runs on the event loop and never blocks it: descriptors are non-blocking, reads are
driven by ``loop.add_reader`` and bounded per callback, and sends that would block are queued until
the socket is writable. The message format is described in ``_zygote.py``: one JSON object per
SOCK_SEQPACKET message, descriptors attached with SCM_RIGHTS.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import json
import os
import socket
from collections import deque
from collections.abc import Callable
from typing import Any

#: Zygote messages handled per loop iteration.
MESSAGES_PER_ITERATION = 64
#: Largest control message (the zygote's messages are far smaller).
MAX_MESSAGE = 1 << 16


def send_with_fds(sock: socket.socket, payload: bytes, fds: list[int]) -> None:
    """Send one message with ``fds`` attached (SCM_RIGHTS). Raises ``OSError`` as ``sendmsg`` does."""
    ancillary = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
    sock.sendmsg([payload], ancillary)


class ControlChannel:
    """The zygote's control socket: queued sends with descriptors, batched reads of JSON messages.

    ``on_message(message, fds)`` gets each decoded message with the descriptors that came with it
    (it owns them). ``on_broken(reason)`` is called once when the socket reaches end-of-file or
    fails; the channel is closed by then.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        sock: socket.socket,
        on_message: Callable[[dict[str, Any], list[int]], None],
        on_broken: Callable[[str], None],
    ) -> None:
        self._loop = loop
        self._sock: socket.socket | None = sock
        self._on_message = on_message
        self._on_broken = on_broken
        self._queue: deque[tuple[bytes, list[int]]] = deque()
        sock.setblocking(False)
        loop.add_reader(sock.fileno(), self._on_readable)

    @property
    def closed(self) -> bool:
        """True once the socket is closed (by ``close`` or because it broke)."""
        return self._sock is None

    def send(self, message: dict[str, Any], fds: list[int]) -> None:
        """Queue ``message``; takes ownership of ``fds`` (closed once sent, or when the channel closes)."""
        if self._sock is None:
            for fd in fds:
                os.close(fd)
            return
        self._queue.append((json.dumps(message).encode(), fds))
        if len(self._queue) == 1:
            self._flush()

    def close(self) -> None:
        """Stop watching the socket, close it and every descriptor still queued. Idempotent."""
        sock, self._sock = self._sock, None
        if sock is not None and not self._loop.is_closed():
            self._loop.remove_reader(sock.fileno())
            self._loop.remove_writer(sock.fileno())
        for _, fds in self._queue:
            for fd in fds:
                os.close(fd)
        self._queue.clear()
        if sock is not None:
            sock.close()

    def _broken(self, reason: str) -> None:
        if self._sock is not None:
            self.close()
            self._on_broken(reason)

    def _flush(self) -> None:
        sock = self._sock
        while self._queue and sock is not None:
            payload, fds = self._queue[0]
            try:
                send_with_fds(sock, payload, fds)
            except BlockingIOError:
                self._loop.add_writer(sock.fileno(), self._flush)
                return
            except OSError:
                self._loop.call_soon(self._broken, "sandbox zygote connection broke")
                return
            self._queue.popleft()
            for fd in fds:
                os.close(fd)
        if sock is not None:
            self._loop.remove_writer(sock.fileno())

    def _on_readable(self) -> None:
        # At most a batch per loop iteration (the socket stays readable): bounded loop blocking.
        for _ in range(MESSAGES_PER_ITERATION):
            sock = self._sock
            if sock is None:
                return
            fds = array.array("i")
            try:
                data, ancillary, _, _ = sock.recvmsg(MAX_MESSAGE, socket.CMSG_SPACE(fds.itemsize))
            except BlockingIOError:
                return
            except OSError:
                data, ancillary = b"", []
            for level, kind, payload in ancillary:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    fds.frombytes(payload[: len(payload) - (len(payload) % fds.itemsize)])
            if not data:
                for fd in fds:
                    os.close(fd)
                self._broken("sandbox zygote exited")
                return
            self._on_message(json.loads(data), list(fds))


def _ignore(*_: object) -> None:
    """What a closed reader calls instead of its callback."""


class OutputCapture:
    """Reads one pipe without blocking the loop; keeps its head and tail, counts every byte.

    ``on_data(total)`` is called after each read with the bytes read so far; ``closed`` resolves
    at end-of-file or ``close``.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        fd: int,
        keep_bytes: int,
        on_data: Callable[[int], None],
    ) -> None:
        self._loop = loop
        self._fd = fd
        self._tail_bytes = keep_bytes // 4
        self._head_bytes = keep_bytes - self._tail_bytes
        self._head = bytearray()
        self._tail = bytearray()
        self._on_data = on_data
        self.total = 0
        self.closed: asyncio.Future[None] = loop.create_future()
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, 1 << 16)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self.close()
            return
        self.total += len(data)
        room = self._head_bytes - len(self._head)
        if room > 0:
            self._head += data[:room]
            data = data[room:]
        if data and self._tail_bytes:
            self._tail += data
            if len(self._tail) > 2 * self._tail_bytes:
                del self._tail[: len(self._tail) - self._tail_bytes]
        self._on_data(self.total)

    def close(self) -> None:
        """Stop reading and close the pipe (what was read is kept). Idempotent.

        Drops ``on_data``: it is usually a closure over this object, and the cycle would leave every
        execution's captures for the cyclic garbage collector."""
        self._on_data = _ignore
        if self._fd < 0:
            return
        self._loop.remove_reader(self._fd)
        os.close(self._fd)
        self._fd = -1
        if not self.closed.done():
            self.closed.set_result(None)

    @property
    def kept(self) -> int:
        """Bytes kept for ``text`` (head plus tail)."""
        return len(self._head) + min(len(self._tail), self._tail_bytes)

    @property
    def truncated(self) -> bool:
        """True when more was written than kept."""
        return self.total > self.kept

    def text(self) -> str:
        """What was kept, decoded (invalid UTF-8 replaced), with an omission marker when cut."""
        tail = bytes(self._tail[-self._tail_bytes :]) if self._tail_bytes else b""
        if not self.truncated:
            return (bytes(self._head) + tail).decode("utf-8", errors="replace")
        omitted = self.total - len(self._head) - len(tail)
        head = bytes(self._head).decode("utf-8", errors="replace")
        return f"{head}\n[... {omitted} bytes omitted ...]\n" + tail.decode("utf-8", errors="replace")


class StatusReader:
    """Reads the worker's one-line exit status (written just before it exits normally).

    ``status`` is the decoded line (a dict with ``exit_code`` or ``setup_error``) or None when the
    worker died without writing one; ``on_status()`` is called once a valid status arrived.
    """

    _LIMIT = 4096

    def __init__(self, loop: asyncio.AbstractEventLoop, fd: int, on_status: Callable[[], None]) -> None:
        self._loop = loop
        self._fd = fd
        self._buffer = bytearray()
        self._on_status = on_status
        self.status: dict[str, Any] | None = None
        os.set_blocking(fd, False)
        loop.add_reader(fd, self._read)

    def _read(self) -> None:
        try:
            data = os.read(self._fd, self._LIMIT)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        self._buffer += data
        line, newline, _ = self._buffer.partition(b"\n")
        if newline:
            with contextlib.suppress(ValueError):
                status = json.loads(line)
                if isinstance(status, dict) and (
                    isinstance(status.get("exit_code"), int) or isinstance(status.get("setup_error"), str)
                ):
                    self.status = status
        if newline or not data or len(self._buffer) > self._LIMIT:
            on_status = self._on_status
            self.close()
            if self.status is not None:
                on_status()

    def close(self) -> None:
        """Stop reading and close the pipe. Idempotent. Drops ``on_status`` (a closure over this
        object, as ``OutputCapture.close`` explains)."""
        self._on_status = _ignore
        if self._fd >= 0:
            self._loop.remove_reader(self._fd)
            os.close(self._fd)
            self._fd = -1
