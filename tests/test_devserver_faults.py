"""Dev server fault hooks used by the soak: cut reply bodies, a seeded per-request fault mix, timed log."""

from __future__ import annotations

import json
import time
from typing import Any

import aiohttp
import pytest

from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient, SGLangConnectionError, SGLangDecodingError

pytestmark = pytest.mark.unit

SCRIPT = [{"match": None, "replies": ["Hello there, this is a scripted reply."]}]


@pytest.fixture
async def server():
    async with DevServer("scripted", script=SCRIPT) as srv:
        yield srv


async def _post(server: DevServer, path: str, payload: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(server.url + path, json=payload) as reply:
        return reply.status, await reply.json(content_type=None)


async def test_truncated_body_is_a_complete_reply_with_half_the_json(server: DevServer) -> None:
    server.inject_fault(cut_body="truncate")
    async with aiohttp.ClientSession() as session:
        async with session.post(server.url + "/generate", json={"input_ids": [1, 2, 3]}) as reply:
            assert reply.status == 200
            raw = await reply.read()
        async with session.post(server.url + "/generate", json={"input_ids": [1, 2, 3]}) as reply:
            whole = await reply.read()
    assert raw.startswith(b'{"text":"Hello there') and len(whole) // 3 < len(raw) < len(whole)
    with pytest.raises(ValueError):
        json.loads(raw)
    async with SGLangClient(server.url, max_retries=0) as client:
        server.inject_fault(cut_body="truncate")
        with pytest.raises(SGLangDecodingError):
            await client.generate([1, 2, 3], {})


async def test_reset_mid_body_is_a_connection_error(server: DevServer) -> None:
    server.inject_fault(cut_body="reset")
    async with SGLangClient(server.url, max_retries=0) as client:
        with pytest.raises(SGLangConnectionError):
            await client.generate([1, 2, 3], {})
        assert (await client.generate([1, 2, 3], {})).finish_reason.type == "stop"
    assert [entry["status"] for entry in server.request_log] == [200, 200]  # ran, then cut
    assert [entry.get("fault") for entry in server.request_log] == ["cut:reset", None]


async def test_fault_mix_is_seeded_per_request_and_bursts(server: DevServer) -> None:
    mix = {"seed": 3, "faults": [{"weight": 0.2, "status": 503, "count": 3}, {"weight": 0.1, "status": 500}]}

    async def statuses() -> list[int]:
        status, described = await _post(server, "/dev/fault_mix", mix)
        assert status == 200 and described["seed"] == 3
        server.clear_request_log()
        for _ in range(60):
            await _post(server, "/generate", {"input_ids": [1, 2, 3]})
        return [entry["status"] for entry in server.request_log]

    first = await statuses()
    assert first == await statuses()  # same seed, same faults in the same order
    assert 200 in first and 500 in first and "503, 503, 503" in ", ".join(map(str, first))
    assert {entry.get("fault") for entry in server.request_log} == {None, "503", "500"}
    server.clear_faults()
    assert (await _post(server, "/generate", {"input_ids": [1]}))[0] == 200


@pytest.mark.parametrize(
    "body",
    [
        {"faults": []},
        {"faults": [{"status": 503}]},
        {"faults": [{"weight": 0.7, "status": 503}, {"weight": 0.7, "status": 500}]},
        {"faults": [{"weight": 0.1, "cut_body": "sideways"}]},
        {"faults": [{"weight": 0.1, "status": 503}], "seed": "x"},
    ],
)
async def test_bad_fault_mixes_are_rejected(server: DevServer, body: dict[str, Any]) -> None:
    status, reply = await _post(server, "/dev/fault_mix", body)
    assert status == 400 and reply["error"]["message"].startswith("bad fault mix:")


async def test_request_log_records_arrival_time(server: DevServer) -> None:
    before = time.time()
    await _post(server, "/generate", {"input_ids": [1, 2, 3]})
    assert before <= server.request_log[-1]["time"] <= time.time()
