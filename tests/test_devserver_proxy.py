"""FaultProxy: the dev server's /dev/ test hooks in front of another server (here a scripted dev server)."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest

from benchmarks.fault_injection import FaultProxy, inject_fault
from strands_slime.devserver import DevServer
from strands_slime.provider.client import (
    SGLangClient,
    SGLangConnectionError,
    SGLangDecodingError,
    SGLangHTTPError,
    SGLangThrottledError,
)

pytestmark = pytest.mark.unit


@pytest.fixture
async def upstream() -> AsyncIterator[DevServer]:
    async with DevServer("scripted", script=[{"match": None, "replies": ["Hi!"]}]) as server:
        yield server


async def test_forwards_records_and_injects_faults(upstream: DevServer) -> None:
    async with FaultProxy(upstream.url, record_replies=True) as proxy:
        async with SGLangClient(proxy.url, max_retries=0) as client:
            reply = await client.generate([1, 2, 3], {"max_new_tokens": 8}, rid="one")
            assert reply.text == "Hi!"
            inject_fault(proxy, status=503, count=1)
            with pytest.raises(SGLangThrottledError, match="The request queue is full"):
                await client.generate([1, 2, 3], {"max_new_tokens": 8})
            inject_fault(proxy, status=500, count=1)
            with pytest.raises(SGLangHTTPError):
                await client.generate([1, 2, 3], {"max_new_tokens": 8})
            assert (await client.model_info())["model_path"], "other paths pass unchanged"
            await client.abort("nothing-live")
        log = proxy.request_log
        assert [entry.get("fault") for entry in log] == [None, "503", "500"]
        assert log[0]["json"]["rid"] == "one" and log[0]["reply"]["output_ids"] == reply.output_ids
        assert "reply" not in log[1], "a faulted request never reached the server"
        assert len(upstream.request_log) == 1
        async with aiohttp.ClientSession() as session:
            async with session.post(
                proxy.url + "/dev/fault_mix", json={"faults": [{"weight": 1, "status": 503}]}
            ) as r:
                assert r.status == 200 and (await r.json())["faults"][0]["status"] == 503
            async with session.post(proxy.url + "/generate", json={"input_ids": [1]}) as r:
                assert r.status == 503
            async with session.get(proxy.url + "/dev/requests") as r:
                assert len(await r.json()) == 4


async def test_cut_bodies_and_dropped_connections_reach_the_client(upstream: DevServer) -> None:
    async with FaultProxy(upstream.url) as proxy, SGLangClient(proxy.url, max_retries=0) as client:
        inject_fault(proxy, cut_body="truncate", count=1)
        inject_fault(proxy, drop_connection=True, count=1)
        with pytest.raises(SGLangDecodingError):
            await client.generate([1, 2, 3], {"max_new_tokens": 8})
        with pytest.raises(SGLangConnectionError):
            await client.generate([1, 2, 3], {"max_new_tokens": 8})
        reply = await client.generate([1, 2, 3], {"max_new_tokens": 8})
        assert reply.text == "Hi!"
        assert [e.get("fault") for e in proxy.request_log] == ["cut:truncate", "drop", None]
