"""One scheduler for every backend: bounded running set, FIFO waiting queue, SGLang's abort rules.

At most ``max_running_requests`` generate at once; the rest wait in order. Aborting a queued request
answers it at once with the queued shape; aborting a running one lets it take one more decode step and
then answers with its partial output and ``finish_reason`` abort.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
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


class Scheduler:
    """Admits, runs, queues and aborts generation requests on one event loop."""

    def __init__(
        self,
        backend: Backend,
        *,
        max_running_requests: int,
        weight_version: Callable[[], str],
        latency: float = 0.0,
        token_latency: float = 0.0,
    ) -> None:
        if max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {max_running_requests}")
        self.backend = backend
        self.renderer = OutputRenderer(backend.tokens)
        self.max_running_requests = max_running_requests
        self.latency = latency
        self.token_latency = token_latency
        self._weight_version = weight_version
        self.live: dict[str, GenerationRequest] = {}
        self._waiting: collections.OrderedDict[GenerationRequest, None] = collections.OrderedDict()
        self._running: set[GenerationRequest] = set()
        self._tasks: set[asyncio.Task[None]] = set()
        self._resume = asyncio.Event()
        self._resume.set()
        self.total_generated_tokens = 0

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
        self.live[request.rid] = request
        if len(self._running) < self.max_running_requests:
            self._start(request)
        else:
            request.status = "queued"
            self._waiting[request] = None
        try:
            return await asyncio.shield(request.future)
        except asyncio.CancelledError:
            self.abort_one(request)
            raise

    async def submit_samples(
        self, base: GenerationRequest, n: int, seeds: Callable[[], int]
    ) -> list[dict[str, Any]]:
        """SGLang's ``n > 1``: one hidden prefill-only warm-up, then ``n`` samples with fresh rids, each
        with the seed ``seeds`` gives; if one fails or the caller goes away, the rest are aborted."""
        await self.submit(base.sample_copy(seed=base.seed, warmup=True))
        tasks = [asyncio.ensure_future(self.submit(base.sample_copy(seed=seeds()))) for _ in range(n)]
        try:
            return list(await asyncio.gather(*tasks))
        except BaseException:
            for task in tasks:
                task.cancel()  # cancelling a submit aborts its request
            await asyncio.gather(*tasks, return_exceptions=True)
            raise

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
            self.total_generated_tokens += accepted
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
