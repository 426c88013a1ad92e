"""The client's typed errors: their own leaf module, still importable from strands_slime.provider.client."""

from __future__ import annotations

import pytest

from strands_slime.provider import client, client_errors
from strands_slime.provider.client_errors import (
    SGLangBadRequestError,
    SGLangContextLengthError,
    SGLangHTTPError,
    SGLangThrottledError,
    classify_http_error,
)

pytestmark = pytest.mark.integration


def test_every_error_is_the_same_class_from_both_modules() -> None:
    for name in client_errors.__all__:
        assert getattr(client, name) is getattr(client_errors, name), name
        if name != "BODY_EXCERPT_CHARS":
            assert name in client.__all__, name


@pytest.mark.parametrize(
    ("status", "body", "kind", "retryable"),
    [
        (503, "busy", SGLangThrottledError, True),
        (429, "slow down", SGLangThrottledError, True),
        (500, "boom", SGLangHTTPError, True),
        (
            400,
            "The input (40000 tokens) is longer than the model's context length",
            SGLangContextLengthError,
            False,
        ),
        (400, "bad temperature", SGLangBadRequestError, False),
        (404, "no such route", SGLangBadRequestError, False),
    ],
)
def test_classify_http_error(status: int, body: str, kind: type, retryable: bool) -> None:
    error = classify_http_error(status, body, url="http://h/generate", attempts=3)
    assert type(error) is kind
    assert error.retryable is retryable
    assert str(error).startswith(f"HTTP {status} from http://h/generate after 3 attempts: ")


def test_long_bodies_are_quoted_shortened() -> None:
    error = classify_http_error(400, "x" * 10_000)
    assert error.body == "x" * 10_000
    assert len(str(error)) < client_errors.BODY_EXCERPT_CHARS + 40


def test_the_errors_module_imports_nothing_heavy() -> None:
    import subprocess
    import sys

    code = "import sys, strands_slime.provider.client_errors; print('aiohttp' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
