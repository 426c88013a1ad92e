"""One scheduler for every backend: bounded running set, FIFO waiting queue, SGLang's abort rules.

At most ``max_running_requests`` generate at once; the rest wait in order. A full waiting queue is
SGLang's 503 "The request queue is full.". Aborting a queued request answers it at once with the
queued shape; aborting a running one lets it take one more decode step and then answers with its
partial output and ``finish_reason`` abort.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

from strands_slime.devserver.backends.base import Backend, Generation
from strands_slime.devserver.engine import (
    ABORTED_RUNNING,
    GenerationRequest,
    OutputRenderer,
    find_finish,
    render_queued_abort,
)
from strands_slime.devserver.protocol import ProtocolError

logger = logging.getLogger(__name__)

_THROUGHPUT_WINDOW_S = 5.0


class Scheduler:
    """Admits, runs, queues and aborts generation requests on one event loop."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_running_requests: int,
        max_queued_requests: int | None,
        weight_version: Callable[[], str],
        latency: float = 0.0,
        token_latency: float = 0.0,
    ) -> None:
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        if max_queued_requests is not None and max_queued_requests < 0:
            raise ValueError(f"max_queued_requests must be >= 0, got {max_queued_requests}")
        if latency < 0 or token_latency < 0:
            raise ValueError("latency and token_latency must be >= 0")
        self.backend = backend
        self.renderer = OutputRenderer(backend.tokens)
        self.max_running_requests = max_running_requests
        self.max_queued_requests = max_queued_requests
        self.latency = latency
        self.token_latency = token_latency
        self._weight_version = weight_version
        self.live: dict[str, GenerationRequest] = {}
        self._waiting: collections.OrderedDict[GenerationRequest, None] = collections.OrderedDict()
        self._running: set[GenerationRequest] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._resume = asyncio.Event()
        self._resume.set()
        self._generated: collections.deque[tuple[float, int]] = collections.deque()
        self.total_generated_tokens = 0
        self.total_requests = 0

    # ------------------------------------------------------------------ state

    @property
    def num_running(self) -> int:
        """Requests generating now."""
        return len(self._running)

    @property
    def num_waiting(self) -> int:
        """Requests queued for a running slot."""
        return len(self._waiting)

    @property
    def paused(self) -> bool:
        """True between ``/pause_generation`` and ``/continue_generation``."""
        return not self._resume.is_set()

    def used_tokens(self) -> int:
        """Tokens (prompt + output so far) held by running requests: the emulated KV usage."""
        return sum(req.prompt_tokens + len(req.output_ids) for req in self._running)

    def waiting_tokens(self) -> int:
        """Prompt tokens of the queued requests."""
        return sum(req.prompt_tokens for req in self._waiting)

    def gen_throughput(self) -> float:
        """Output tokens per second over the last few seconds (``/v1/loads``' ``gen_throughput``)."""
        now = time.monotonic()
        while self._generated and now - self._generated[0][0] > _THROUGHPUT_WINDOW_S:
            self._generated.popleft()
        return sum(count for _, count in self._generated) / _THROUGHPUT_WINDOW_S

    # ------------------------------------------------------------------ submit

    async def submit(self, request: GenerationRequest) -> dict[str, Any]:
        """Run ``request`` to its end and return its response body (aborts included).

        Cancelling the caller (a client that disconnected) aborts the request, like SGLang does.
        """
        if request.rid in self.live:
            raise ProtocolError.value(f"Duplicate request ID detected: {request.rid}")
        if self.paused:
            await self._resume.wait()  # SGLang blocks new requests while generation is paused
            if request.rid in self.live:
                raise ProtocolError.value(f"Duplicate request ID detected: {request.rid}")
        loop = asyncio.get_running_loop()
        request.future = loop.create_future()
        # Retrieve the outcome even when the caller is gone, so no "never retrieved" warning is left.
        request.future.add_done_callback(lambda fut: fut.cancelled() or fut.exception())
        if len(self._running) < self.max_running_requests:
            self.live[request.rid] = request
            self._start(request)
        elif self.max_queued_requests is not None and len(self._waiting) >= self.max_queued_requests:
            raise ProtocolError.http("The request queue is full.", 503)
        else:
            self.live[request.rid] = request
            request.status = "queued"
            self._waiting[request] = None
        self.total_requests += 1
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            self.abort_one(request)
            raise

    async def submit_all(self, requests: list[GenerationRequest]) -> list[dict[str, Any]]:
        """Run several requests at once; if one fails or the caller goes away, abort the rest.

        Raises:
            ProtocolError: the first refusal (queue full, duplicate rid) among them.
        """
        if len(requests) == 1:
            return [await self.submit(requests[0])]
        tasks = [asyncio.ensure_future(self.submit(request)) for request in requests]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()  # cancelling a submit aborts its request
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

    async def submit_samples(
        self, base: GenerationRequest, n: int, seeds: Callable[[], int]
    ) -> list[dict[str, Any]]:
        """SGLang's ``n > 1``: one hidden prefill-only warm-up, then ``n`` samples with fresh rids.

        ``seeds`` gives each sample's sampling seed (the request's own when it sent
        ``sampling_seed``, else a fresh draw per sample).
        """
        await self.submit(base.sample_copy(seed=base.seed, warmup=True))
        return await self.submit_all([base.sample_copy(seed=seeds()) for _ in range(n)])

    def _start(self, request: GenerationRequest) -> None:
        request.status = "running"
        self._running.add(request)
        task = asyncio.get_running_loop().create_task(self._execute(request), name=f"generate-{request.rid}")
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    def _admit_waiting(self) -> None:
        while self._waiting and len(self._running) < self.max_running_requests:
            request, _ = self._waiting.popitem(last=False)
            self._start(request)

    # ------------------------------------------------------------------ running

    def _count_generated(self, count: int) -> None:
        self.total_generated_tokens += count
        self._generated.append((time.monotonic(), count))

    async def _generate(self, request: GenerationRequest, generation: Generation) -> None:
        if self.latency:
            await asyncio.sleep(self.latency)
        request.prefill = await generation.prefill()
        tokens = self.backend.tokens
        while True:
            if len(request.output_ids) >= request.max_new_tokens:
                request.finish_reason = {"type": "length", "length": request.max_new_tokens}
                return
            remaining = request.max_new_tokens - len(request.output_ids)
            steps = await generation.next_tokens(1 if self.token_latency else remaining)
            if self.token_latency and steps:
                await asyncio.sleep(self.token_latency * len(steps))
            if not steps:
                # The backend has nothing more (a scripted reply without a stop token): the output
                # ends here as if its budget ran out at this length.
                request.finish_reason = {"type": "length", "length": len(request.output_ids)}
                return
            accepted, finish = await find_finish(tokens, request, steps)
            request.accept(steps[:accepted])
            self._count_generated(accepted)
            if finish is not None:
                request.finish_reason = finish
                return
            if request.abort_requested:
                request.finish_reason = dict(ABORTED_RUNNING)
                return

    async def _execute(self, request: GenerationRequest) -> None:
        assert request.future is not None
        generation: Generation | None = None
        outcome: dict[str, Any] | BaseException
        try:
            generation = self.backend.open(request)
            await self._generate(request, generation)
        except ProtocolError as exc:
            outcome = exc
        except Exception as exc:
            logger.exception("generation failed for rid %s", request.rid)
            outcome = ProtocolError.http(
                f"Internal error in the dev server: {type(exc).__name__}: {exc}", 500
            )
        else:
            outcome = {}
        if generation is not None:
            try:
                await generation.close(list(request.output_ids))
            except Exception:
                logger.exception("releasing rid %s failed", request.rid)
        if not isinstance(outcome, BaseException):
            try:
                outcome = await self.renderer.render(request, weight_version=self._weight_version())
            except Exception as exc:
                logger.exception("rendering rid %s failed", request.rid)
                outcome = ProtocolError.http(f"Internal error in the dev server: {exc}", 500)
        request.status = "finished"
        self._running.discard(request)
        if self.live.get(request.rid) is request:
            del self.live[request.rid]
        if not request.future.done():
            if isinstance(outcome, BaseException):
                request.future.set_exception(outcome)
            else:
                request.future.set_result(outcome)
        self._admit_waiting()

    # ------------------------------------------------------------------ abort / pause

    def abort_one(self, request: GenerationRequest) -> None:
        """Abort one request: a queued one answers at once, a running one after its next step."""
        if request.status == "queued":
            self._waiting.pop(request, None)
            request.status = "finished"
            if self.live.get(request.rid) is request:
                del self.live[request.rid]
            if request.future is not None and not request.future.done():
                request.future.set_result(render_queued_abort(request, self._weight_version()))
        elif request.status == "running":
            request.abort_requested = True

    def abort(self, rid: str | None = None, *, abort_all: bool = False) -> int:
        """Abort like SGLang 0.5.23 (one tokenizer worker); returns how many requests matched.

        ``TokenizerManager.abort_request`` forwards an abort only for an exact live rid (an empty
        or unknown rid, or a mere prefix, does nothing); ``Scheduler.abort_request`` then aborts
        every live request whose rid starts with it. ``abort_all`` aborts everything.
        """
        if abort_all:
            targets = list(self.live.values())
        elif rid and rid in self.live:
            targets = [req for req in self.live.values() if req.rid.startswith(rid)]
        else:
            targets = []
        # Queued first, so aborting running requests cannot admit a queued one that is also a target.
        for request in sorted(targets, key=lambda req: req.status != "queued"):
            self.abort_one(request)
        return len(targets)

    def pause(self) -> None:
        """``/pause_generation`` in SGLang's default ``abort`` mode: abort everything; new requests
        wait until :meth:`resume` (slime pauses like this around a weight update)."""
        self._resume.clear()
        self.abort(abort_all=True)

    def resume(self) -> None:
        """``/continue_generation``: admit the requests that waited while paused."""
        self._resume.set()

    async def wait_until_idle(self, timeout: float = 30.0) -> bool:
        """Wait for the running requests to end (aborted ones take one more step); False on timeout."""
        if not self._tasks:
            return True
        _done, pending = await asyncio.wait(set(self._tasks), timeout=timeout)
        if pending:
            logger.warning("%d requests still running %.0f s after an abort", len(pending), timeout)
        return not pending

    async def shutdown(self) -> None:
        """Abort everything and wait for running requests to wind down."""
        self._resume.set()
        self.abort(abort_all=True)
        if self._tasks:
            with contextlib.suppress(Exception):
                await asyncio.wait(set(self._tasks), timeout=10)
