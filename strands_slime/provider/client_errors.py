"""Errors raised by :class:`~strands_slime.provider.client.SGLangClient`, and how an HTTP reply maps to one.

It imports only :mod:`strands_slime.aborts` (an abort is also an :class:`~strands_slime.aborts.AbortedError`),
so code that only catches these errors does not pull in aiohttp. ``strands_slime.provider.client`` re-exports every name.
"""

from __future__ import annotations

from strands_slime.aborts import AbortedError

__all__ = [
    "BODY_EXCERPT_CHARS",
    "RETRYABLE_STATUSES",
    "SGLangAbortedError",
    "SGLangBadRequestError",
    "SGLangClientError",
    "SGLangConnectionError",
    "SGLangContextLengthError",
    "SGLangDecodingError",
    "SGLangHTTPError",
    "SGLangThrottledError",
    "SGLangTimeoutError",
    "classify_http_error",
]

RETRYABLE_STATUSES = frozenset({408, 429, 503})
"""Statuses that mean "overloaded, try again" (on top of every 5xx)."""
BODY_EXCERPT_CHARS = 500
"""How much of an error reply's body an exception message quotes."""
_CONTEXT_ERROR_MARKERS = ("exceed", "longer than", "context length", "too long", "maximum length")


class SGLangClientError(Exception):
    """Base class of every error raised by :class:`~strands_slime.provider.client.SGLangClient`."""

    retryable: bool = False


class SGLangHTTPError(SGLangClientError):
    """The server answered with a non-200 status."""

    def __init__(self, status: int, body: str, *, url: str = "", attempts: int = 1) -> None:
        self.status = status
        self.body = body
        self.url = url
        self.attempts = attempts
        self.retryable = status >= 500 or status in RETRYABLE_STATUSES
        excerpt = body if len(body) <= BODY_EXCERPT_CHARS else body[:BODY_EXCERPT_CHARS] + "..."
        where = f" from {url}" if url else ""
        tries = f" after {attempts} attempts" if attempts > 1 else ""
        super().__init__(f"HTTP {status}{where}{tries}: {excerpt}")


class SGLangBadRequestError(SGLangHTTPError):
    """A deterministic client error (400 invalid parameter, 401/403/404 ...): retrying cannot help."""


class SGLangContextLengthError(SGLangBadRequestError):
    """The prompt (plus ``max_new_tokens``) does not fit in the model's context window."""


class SGLangThrottledError(SGLangHTTPError):
    """The server is overloaded (408/429/503) and stayed so for every retry."""


class SGLangConnectionError(SGLangClientError):
    """The server could not be reached (refused, reset, timed out) for every retry."""

    retryable = True


class SGLangTimeoutError(SGLangConnectionError):
    """A deadline passed: ``timeout`` (retried), the reply stalled mid-body (retried), or no reply at all
    within ``first_byte_timeout`` (not retried: the generation itself is too slow or the server hung)."""

    def __init__(self, message: str, *, retryable: bool) -> None:
        super().__init__(message)
        self.retryable = retryable


class SGLangAbortedError(SGLangClientError, AbortedError):
    """The caller's abort flag was set: the request was not sent, or its wait was cut short."""


class SGLangDecodingError(SGLangClientError):
    """The server returned a body that is not the JSON we expect (truncated, garbled, wrong shape)."""

    retryable = True


def classify_http_error(status: int, body: str, *, url: str = "", attempts: int = 1) -> SGLangHTTPError:
    """Map a non-200 reply to the typed error the caller should see; the message quotes the body and
    names the URL and, when more than one, the attempts.

    Returns:
        :class:`SGLangThrottledError` for 408/429/503, :class:`SGLangHTTPError` (retryable) for other 5xx,
        :class:`SGLangContextLengthError` for a 400 about the context length, else
        :class:`SGLangBadRequestError` (not retryable).
    """
    if status in RETRYABLE_STATUSES:
        return SGLangThrottledError(status, body, url=url, attempts=attempts)
    if status >= 500:
        return SGLangHTTPError(status, body, url=url, attempts=attempts)
    lowered = body.lower()
    if status == 400 and any(marker in lowered for marker in _CONTEXT_ERROR_MARKERS):
        return SGLangContextLengthError(status, body, url=url, attempts=attempts)
    return SGLangBadRequestError(status, body, url=url, attempts=attempts)
