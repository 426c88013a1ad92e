"""Differential conformance: the dev server's hf backend against SGLang 0.5.23, same weights.

Each corpus case (tests/sglang/corpus.py) goes to both servers. A difference in status, response keys,
``meta_info`` keys and value types, greedy output ids, text, finish reason, logprobs (1e-5) or error body
fails the case unless docs/devserver.md lists it ("Differences from SGLang 0.5.23"), and a listed
difference that no case shows fails too (the list stays true). The results table is written to
``out/sglang-lane/conformance.md`` (docs/sglang-lane.md quotes it).
"""

from __future__ import annotations

import asyncio
import fnmatch
import json
import re
import urllib.error
import urllib.request
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from corpus import CASES, CONTEXT, Case
from sglang_server import MAX_TOTAL_TOKENS, REPO_ROOT, SGLangServer

from benchmarks.devserver_reference import full_forward_logprobs
from benchmarks.devserver_runners import DevServerThread

pytestmark = pytest.mark.sglang

TOLERANCE = 1e-5
DOC = REPO_ROOT / "docs" / "devserver.md"
DOC_HEADING = "## Differences from SGLang 0.5.23"
VOLATILE = {"id", "e2e_latency", "response_sent_to_client_ts", "cached_tokens", "cached_tokens_details"}
"""``meta_info`` values that differ between any two runs (ids, clocks, each server's cache history):
only their presence and type are compared."""
PRESENCE_ONLY = {"cached_tokens_details"}
"""Null without a prefix-cache hit, an object with one: which it is depends on each server's history."""
LOGPROB_KEYS = ("input_token_logprobs", "output_token_logprobs")
TOP_KEYS = (
    "input_top_logprobs",
    "output_top_logprobs",
    "input_token_ids_logprobs",
    "output_token_ids_logprobs",
)

RESULTS: dict[str, list[str]] = {}
"""case id -> its differences (``field: dev … / sglang …``), filled as the cases run."""


def documented() -> list[tuple[str, str, str]]:
    """(case pattern, field pattern, reason) rows of docs/devserver.md's differences table."""
    text = DOC.read_text(encoding="utf-8")
    assert DOC_HEADING in text, f"{DOC} has no '{DOC_HEADING}' section"
    section = text.split(DOC_HEADING, 1)[1].split("\n## ", 1)[0]
    rows = []
    for line in section.splitlines():
        match = re.match(r"\|\s*`([^`]+)`\s*\|\s*`([^`]+)`\s*\|\s*(.+?)\s*\|\s*$", line)
        if match:
            rows.append((match[1], match[2], match[3]))
    assert rows, "the differences table is empty or unparsable"
    return rows


def explained(case_id: str, difference: str, rows: list[tuple[str, str, str]]) -> bool:
    field = difference.split(":", 1)[0]
    return any(fnmatch.fnmatch(case_id, case) and fnmatch.fnmatch(field, name) for case, name, _ in rows)


@pytest.fixture(scope="module")
def dev(checkpoints: dict[int, Path]) -> Iterator[DevServerThread]:
    """The dev server's hf backend on the same checkpoint, context and KV budget as SGLang."""
    with DevServerThread(
        "hf", model=str(checkpoints[0]), context_length=CONTEXT, max_total_tokens=MAX_TOTAL_TOKENS, seed=0
    ) as server:
        yield server


def send(url: str, body: dict[str, Any]) -> tuple[int, Any]:
    request = urllib.request.Request(
        url + "/generate", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(request, timeout=600) as reply:
            return reply.status, _decode(reply.read())
    except urllib.error.HTTPError as error:
        return error.code, _decode(error.read())


def _decode(raw: bytes) -> Any:
    try:
        return json.loads(raw)
    except ValueError:
        return raw.decode(errors="replace")


def _type(value: Any) -> str:
    return (
        "number" if isinstance(value, (int, float)) and not isinstance(value, bool) else type(value).__name__
    )


def compare(case: Case, dev: tuple[int, Any], real: tuple[int, Any]) -> list[str]:
    """The differences between the two replies, as ``field: dev … / sglang …``."""
    (dev_status, dev_body), (status, body) = dev, real
    if dev_status != status:
        return [f"status: dev {dev_status} / sglang {status} ({str(dev_body)[:160]} / {str(body)[:160]})"]
    if status != 200:
        return [] if dev_body == body else [f"error body: dev {dev_body} / sglang {body}"]
    if isinstance(body, list) or isinstance(dev_body, list):
        if not (isinstance(body, list) and isinstance(dev_body, list) and len(body) == len(dev_body)):
            return [f"shape: dev {_type(dev_body)} / sglang {_type(body)}"]
        return [d for a, b in zip(dev_body, body, strict=True) for d in compare_one(case, a, b)]
    return compare_one(case, dev_body, body)


def compare_one(case: Case, dev: dict[str, Any], real: dict[str, Any]) -> list[str]:
    out = []
    if set(dev) != set(real):
        out.append(f"keys: dev {sorted(set(dev) - set(real))} / sglang {sorted(set(real) - set(dev))}")
    dev_meta, meta = dev.get("meta_info", {}), real.get("meta_info", {})
    for key in sorted(set(dev_meta) | set(meta)):
        if key not in dev_meta or key not in meta:
            where = "dev" if key in dev_meta else "sglang"
            out.append(f"meta_info.{key}: only in {where}")
        elif key not in PRESENCE_ONLY and _type(dev_meta[key]) != _type(meta[key]):
            out.append(f"meta_info.{key} type: dev {_type(dev_meta[key])} / sglang {_type(meta[key])}")
    if not case.greedy:
        return out
    for key in ("output_ids", "text"):
        if dev.get(key) != real.get(key):
            out.append(f"{key}: dev {dev.get(key)!r} / sglang {real.get(key)!r}")
    for key in sorted(set(dev_meta) & set(meta) - VOLATILE - set(LOGPROB_KEYS) - set(TOP_KEYS)):
        if dev_meta[key] != meta[key]:
            out.append(f"meta_info.{key}: dev {dev_meta[key]!r} / sglang {meta[key]!r}")
    for key in LOGPROB_KEYS:
        if key in dev_meta and key in meta:
            out.extend(_compare_entries(key, dev_meta[key], meta[key]))
    for key in TOP_KEYS:
        if key in dev_meta and key in meta:
            out.extend(_compare_top(key, dev_meta[key], meta[key]))
    return out


def _compare_entries(key: str, dev: list[Any], real: list[Any]) -> list[str]:
    if len(dev) != len(real):
        return [f"meta_info.{key} length: dev {len(dev)} / sglang {len(real)}"]
    for i, (a, b) in enumerate(zip(dev, real, strict=True)):
        if a[1:] != b[1:] or (a[0] is None) != (b[0] is None):
            return [f"meta_info.{key}[{i}]: dev {a} / sglang {b}"]
        if a[0] is not None and abs(a[0] - b[0]) > TOLERANCE:
            return [f"meta_info.{key}[{i}] logprob: dev {a[0]} / sglang {b[0]}"]
    return []


def _compare_top(key: str, dev: list[Any], real: list[Any]) -> list[str]:
    if len(dev) != len(real):
        return [f"meta_info.{key} length: dev {len(dev)} / sglang {len(real)}"]
    for i, (a, b) in enumerate(zip(dev, real, strict=True)):
        if (a is None) != (b is None):
            return [f"meta_info.{key}[{i}]: dev {a} / sglang {b}"]
        if a is not None:
            found = _compare_entries(
                f"{key}[{i}]", sorted(a, key=lambda e: e[1]), sorted(b, key=lambda e: e[1])
            )
            if found:
                return found
    return []


def check_sampled(case: Case, reply: Any, reference: Any) -> None:
    """A sampled reply's logprobs are those of an fp32 forward pass over its tokens (each server)."""
    for one in reply if isinstance(reply, list) else [reply]:
        prompt = case.body["input_ids"]
        ids = prompt + one["output_ids"]
        expected = full_forward_logprobs(reference, ids)[len(prompt) - 1 :]
        got = [entry[0] for entry in one["meta_info"]["output_token_logprobs"]]
        params = case.body.get("sampling_params", {})
        if "regex" in params or params.get("temperature", 1.0) != 1.0 or params.get("top_k", 0) != 0:
            continue  # logprobs after a grammar mask or of a tempered distribution: shape only
        assert all(abs(a - b) <= TOLERANCE for a, b in zip(got, expected, strict=True)), case.id


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_case(
    case: Case, dev: DevServerThread, sglang: SGLangServer, reference_models: dict[int, Any]
) -> None:
    dev_reply = send(dev.url, case.body)
    real_reply = send(sglang.url, case.body)
    differences = compare(case, dev_reply, real_reply)
    RESULTS[case.id] = differences
    if not case.greedy:
        for status, reply in (dev_reply, real_reply):
            if status == 200:
                check_sampled(case, reply, reference_models[0])
    rows = documented()
    unexplained = [d for d in differences if not explained(case.id, d, rows)]
    assert not unexplained, "\n".join(unexplained)


async def test_abort_of_a_running_request_has_the_same_shape(
    dev: DevServerThread, sglang: SGLangServer
) -> None:
    body = {
        "input_ids": [5, 6, 7],
        "rid": "abort-me",
        "sampling_params": {"max_new_tokens": 3000, "ignore_eos": True},
    }
    replies = []
    for url in (dev.url, sglang.url):
        task = asyncio.create_task(asyncio.to_thread(send, url, body))
        for _ in range(2000):  # poll: abort once the request is live (an unknown rid is a no-op)
            await asyncio.sleep(0.05)
            await asyncio.to_thread(_post, url + "/abort_request", {"rid": "abort-me"})
            if task.done():
                break
        replies.append(await task)
    (dev_status, dev_body), (status, body) = replies
    assert dev_status == status == 200
    differences = compare_one(Case("abort/running", body, greedy=False), dev_body, body)
    assert body["meta_info"]["finish_reason"] == dev_body["meta_info"]["finish_reason"]
    RESULTS["abort/running"] = differences
    assert not [d for d in differences if not explained("abort/running", d, documented())]


def _post(url: str, body: dict[str, Any]) -> int:
    request = urllib.request.Request(
        url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(request, timeout=60) as reply:
        return reply.status


def test_every_documented_difference_still_exists_and_the_table(lane_dir: Path) -> None:
    assert len(RESULTS) >= 200, "the corpus ran"
    rows = documented()
    stale = [
        (case, name)
        for case, name, _ in rows
        if not any(
            fnmatch.fnmatch(case_id, case) and fnmatch.fnmatch(d.split(":", 1)[0], name)
            for case_id, found in RESULTS.items()
            for d in found
        )
    ]
    families = Counter(case_id.split("/", 1)[0] for case_id in RESULTS)
    differing = Counter(case_id.split("/", 1)[0] for case_id, found in RESULTS.items() if found)
    lines = ["| family | cases | identical | documented differences |", "|---|---:|---:|---:|"]
    for family in sorted(families):
        lines.append(
            f"| {family} | {families[family]} | {families[family] - differing[family]} | {differing[family]} |"
        )
    lines.append(
        f"| **all** | {sum(families.values())} | {sum(families.values()) - sum(differing.values())} | {sum(differing.values())} |"
    )
    (lane_dir / "conformance.md").write_text("\n".join(lines) + "\n")
    (lane_dir / "conformance.json").write_text(json.dumps(RESULTS, indent=1))
    assert not stale, f"docs/devserver.md lists differences no case shows any more: {stale}"
