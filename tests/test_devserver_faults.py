"""Fault injection (benchmarks/fault_injection.py) on the dev server: statuses with SGLang's bodies, dropped
connections, delays, cut reply bodies, a seeded per-request fault mix; and the old names' deprecation."""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp
import pytest

from benchmarks.fault_injection import clear_faults, inject_fault, with_faults
from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangClient, SGLangConnectionError, SGLangDecodingError

pytestmark = pytest.mark.unit

SCRIPT = [{"match": None, "replies": ["Hello there, this is a scripted reply."]}]


@pytest.fixture
async def server():
    async with with_faults(DevServer("scripted", script=SCRIPT)) as srv:
        yield srv


async def _post(server: DevServer, path: str, payload: Any) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(server.url + path, json=payload) as reply:
        return reply.status, await reply.json(content_type=None)


async def test_truncated_body_is_a_complete_reply_with_half_the_json(server: DevServer) -> None:
    inject_fault(server, cut_body="truncate")
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
        inject_fault(server, cut_body="truncate")
        with pytest.raises(SGLangDecodingError):
            await client.generate([1, 2, 3], {})


async def test_reset_mid_body_is_a_connection_error(server: DevServer) -> None:
    inject_fault(server, cut_body="reset")
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
    clear_faults(server)
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


async def post(server: DevServer, payload: Any, path: str = "/generate") -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.post(server.url + path, json=payload) as reply:
        text = await reply.text()
        return reply.status, json.loads(text) if text else None


async def get(server: DevServer, path: str) -> tuple[int, Any]:
    async with aiohttp.ClientSession() as session, session.get(server.url + path) as reply:
        return reply.status, await reply.json(content_type=None)


async def test_fault_status_then_recovery(server):
    status, body = await post(server, {"status": 503, "count": 2}, "/dev/faults")
    assert status == 200 and body["pending"][0]["count"] == 2
    async with SGLangClient(server.url, max_retries=3, retry_delay=0.01) as client:
        response = await client.generate([1, 2, 3], {})
    assert response.finish_reason.type == "stop"
    assert [entry["status"] for entry in server.request_log] == [503, 503, 200]
    assert (await get(server, "/dev/faults"))[1] == []


async def test_fault_bodies_follow_sglang(server):
    inject_fault(server, status=503)
    status, body = await post(server, {"input_ids": [1]})
    assert status == 503 and body["type"] == "503" and body["code"] == 503
    inject_fault(server, status=400, message="bad thing")
    assert await post(server, {"input_ids": [1]}) == (400, {"error": {"message": "bad thing"}})


async def test_fault_drop_connection(server):
    inject_fault(server, drop_connection=True)
    async with SGLangClient(server.url, max_retries=0) as client:
        with pytest.raises(SGLangConnectionError):
            await client.generate([1, 2, 3], {})
        assert (await client.generate([1, 2, 3], {})).finish_reason.type == "stop"
    assert server.request_log[0]["status"] is None


async def test_fault_delay(server):
    inject_fault(server, delay_s=0.3)
    loop = asyncio.get_running_loop()
    started = loop.time()
    status, _ = await post(server, {"input_ids": [1, 2, 3]})
    assert status == 200 and loop.time() - started >= 0.3


@pytest.mark.parametrize(
    "spec",
    [{"status": 200}, {"count": 0, "status": 503}, {"drop_connection": True, "status": 503}, {}, {"oops": 1}],
)
async def test_bad_fault_specs_are_rejected(server, spec):
    status, body = await post(server, spec, "/dev/faults")
    assert status == 400 and body["error"]["message"].startswith("bad fault:")
    assert (await get(server, "/dev/faults"))[1] == []


async def test_inject_fault_validates(server):
    with pytest.raises(ValueError, match="status"):
        inject_fault(server, status=200)
    with pytest.raises(ValueError, match="needs status"):
        inject_fault(server)


async def test_the_old_names_warn_and_name_the_new_place() -> None:
    import strands_slime.devserver as devserver
    from benchmarks import devserver_reference, devserver_runners, fault_injection

    for name, module in (
        ("Fault", fault_injection),
        ("FaultProxy", fault_injection),
        ("DevServerProcess", devserver_runners),
        ("DevServerThread", devserver_runners),
        ("full_forward_logprobs", devserver_reference),
        ("scripted_output_logprobs", devserver_reference),
    ):
        with pytest.warns(DeprecationWarning, match=r"moved out of the package to benchmarks/\w+\.py"):
            assert getattr(devserver, name) is getattr(module, name)
    with pytest.warns(DeprecationWarning, match="benchmarks/fault_injection.py"):
        from strands_slime.devserver.proxy import FaultProxy
    assert FaultProxy is fault_injection.FaultProxy
    with pytest.warns(DeprecationWarning, match=r"devserver\.faults\.inject_fault moved .*fault_injection"):
        from strands_slime.devserver.faults import inject_fault as old_inject_fault
    assert old_inject_fault is fault_injection.inject_fault
    with pytest.warns(DeprecationWarning, match="benchmarks/devserver_runners.py"):
        from strands_slime.devserver.runners import DevServerThread
    assert DevServerThread is devserver_runners.DevServerThread
    with pytest.warns(DeprecationWarning, match="benchmarks/devserver_reference.py"):
        from strands_slime.devserver.backends.scripted import scripted_output_logprobs
    assert scripted_output_logprobs is devserver_reference.scripted_output_logprobs
    with pytest.raises(ImportError, match="cannot import name 'Nothing'"):
        from strands_slime.devserver.runners import Nothing  # noqa: F401
    async with DevServer("scripted", script=SCRIPT) as server:
        with pytest.warns(
            DeprecationWarning, match=r"DevServer.inject_fault moved .*fault_injection\.inject_fault"
        ):
            server.inject_fault(status=503)
        assert (await post(server, {"input_ids": [1, 2]}))[0] == 503
