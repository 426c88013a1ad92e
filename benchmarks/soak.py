"""Fault-injection soak of ``generate`` against the scripted dev server (``make soak``; not in CI).

    python benchmarks/soak.py                          # full: 3,000 fault episodes + 1,024 load episodes
    python benchmarks/soak.py --episodes 300 --load-episodes 64     # what the test suite runs
    python benchmarks/soak.py --write-doc              # also rewrite docs/soak.md
    python benchmarks/soak.py --upstream http://127.0.0.1:30000 --episodes 60 --load-episodes 16 \
        --concurrency 8 --step-size 20 --max-response-len 24 --request-timeout 15   # a real SGLang

With ``--upstream`` the same fault mix, server aborts and kill/restart hit a real SGLang server (or
router): a fault proxy (``benchmarks/fault_injection.py --upstream``) in a child process takes the dev
server's place, and it is the proxy that is killed and restarted.

Fault phase: episodes run in slime-like rollout steps (a fresh ``args`` per step, ``concurrency``
in flight) against a dev server in a child process. Every ``/generate`` request draws a fault from a
seeded mix (503/500 bursts, dropped connections, resets mid-body, truncated JSON, slow and hanging
replies, 400 context errors); every prompt draws a scenario (a normal tool solve, malformed tool
calls, crashing / looping / flooding / forking tool code, a tool loop); the server aborts everything
running or queued now and then; every third step slime aborts (``args.abort_event``); once the server
is killed (SIGKILL) and restarted on the same port. Load phase: ``load_episodes`` episodes at once
against 0.5–2 s reply latency.

Reported (goals): escaped exceptions (0), invalid samples by slime's invariants (0), the fault →
status matrix (as documented in docs/soak.md), requests sent after a slime abort (0; send times
recorded on the client side), time from abort to return (p50/max ≤ 1 s), event-loop blocking max
(loop-thread CPU between two wakes of a 2 ms timer: ≤ 50 ms; the wall-clock stall, which also counts
waiting for a CPU, is reported next to it) and resource trends between idle points (RSS, fds, child
processes, asyncio tasks: flat).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import datetime
import gc
import json
import logging
import math
import os
import platform
import random
import signal
import statistics
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

import aiohttp  # noqa: E402
import psutil  # noqa: E402

from strands_slime import generate, reward_func  # noqa: E402
from strands_slime.episode_metadata import EpisodeMetadata  # noqa: E402
from strands_slime.provider.tokenizer import load_tokenizer  # noqa: E402
from strands_slime.rollout.gc_policy import gc_policy  # noqa: E402
from strands_slime.rollout.offline import RolloutOptions, sampling_params, slime_args  # noqa: E402
from strands_slime.rollout.slime_compat import Sample, status_name  # noqa: E402

DOC_PATH = REPO_ROOT / "docs" / "soak.md"
FAULT_SERVER = "benchmarks.fault_injection"
"""The dev server (or a proxy in front of a real one) with the /dev/ fault hooks, run from the repository
root in a child process."""
STATUSES = ("completed", "truncated", "aborted", "failed")
CONTEXT_ERROR = "The input (41234 tokens) is longer than the model's context length (40960 tokens)."

# --------------------------------------------------------------------------- what the model "says"


def _tool_call(code: str) -> str:
    payload = json.dumps({"name": "execute_python_code", "arguments": {"code": code}})
    return f"<think>\nLet me compute.\n</think>\n\n<tool_call>\n{payload}\n</tool_call>"


ANSWER = "The result is 34.\n\nAnswer: \\boxed{34}"
FORK_CODE = (
    "import os, time\n"
    "for _ in range(4):\n"
    "    if os.fork() == 0:\n"
    "        time.sleep(30)\n"
    "        os._exit(0)\n"
    "print('forked')"
)
# scenario: (weight, replies); a prompt carries its tag, the script rule matches it
SCENARIOS: dict[str, tuple[float, list[str]]] = {
    "tool: normal": (0.5, [_tool_call("print(17 * 2)"), ANSWER]),
    "tool call: malformed": (
        0.1,
        ['<tool_call>\n{"name": "execute_python_code", "arguments": {"code": "1}\n</tool_call>', ANSWER],
    ),
    "tool code: crash": (0.08, [_tool_call("raise RuntimeError('boom')"), ANSWER]),
    "tool code: loop": (0.06, [_tool_call("while True:\n    pass"), ANSWER]),
    "tool code: flood": (0.08, [_tool_call("print('x' * 20_000_000)"), ANSWER]),
    "tool code: fork": (0.08, [_tool_call(FORK_CODE), ANSWER]),
    "tool loop (iteration limit)": (0.1, [_tool_call("print(1)")]),  # the last reply repeats
}

# per request: (weight, fault) for the dev server's seeded mix
FAULT_MIX: list[dict[str, Any]] = [
    {"weight": 0.02, "status": 503, "count": 3},
    {"weight": 0.01, "status": 500, "count": 2},
    {"weight": 0.01, "drop_connection": True},
    {"weight": 0.01, "cut_body": "reset"},
    {"weight": 0.01, "cut_body": "truncate"},
    {"weight": 0.03, "delay_s": 1.5},
    {"weight": 0.004, "delay_s": 20.0},  # hangs past the client's timeout
    {"weight": 0.01, "status": 400, "message": CONTEXT_ERROR},
]
FAULT_NAMES = {
    "503": "503 burst",
    "500": "500 burst",
    "drop": "connection dropped",
    "cut:reset": "reset mid-body",
    "cut:truncate": "truncated JSON",
    "delay:1.5": "slow reply (1.5 s)",
    "delay:20": "hanging reply (20 s)",
    "400": "400 context error",
}
LOAD_LATENCY_MIX = [{"weight": 0.25, "delay_s": delay} for delay in (0.5, 1.0, 1.5, 2.0)]

SOAK_CONFIG = {
    "client": {"timeout_s": 5.0, "max_retries": 8, "retry_delay_s": 0.2, "max_retry_delay_s": 2.0},
    "sandbox": {"timeout_s": 2.0},
    "max_tool_iters": 3,
}


def soak_script() -> dict[str, Any]:
    rules = [{"match": f"[soak:{tag}]", "replies": replies} for tag, (_w, replies) in SCENARIOS.items()]
    return {"rules": rules}


# --------------------------------------------------------------------------- the server


class ServerProcess:
    """The dev server in a child process on a fixed port, so it can be killed and restarted."""

    def __init__(self, script_path: Path, extra: list[str]) -> None:
        self.script_path = script_path
        self.extra = extra
        self.port = 0
        self.process: asyncio.subprocess.Process | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        argv = [sys.executable, "-m", FAULT_SERVER, "--backend", "scripted"]
        argv += ["--script", str(self.script_path), "--port", str(self.port), *self.extra]
        self.process = await asyncio.create_subprocess_exec(
            *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.DEVNULL, cwd=REPO_ROOT
        )
        assert self.process.stdout is not None
        while True:
            line = (await asyncio.wait_for(self.process.stdout.readline(), 120)).decode()
            if not line:
                raise RuntimeError("the dev server exited during start-up")
            if line.startswith("DEVSERVER_URL="):
                self.port = int(line.strip().rsplit(":", 1)[1])
                break

    async def kill(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.send_signal(signal.SIGKILL)
            await self.process.wait()

    async def stop(self) -> None:
        if self.process is not None and self.process.returncode is None:
            self.process.terminate()
            try:
                await asyncio.wait_for(self.process.wait(), 10)
            except asyncio.TimeoutError:
                await self.kill()

    def pids(self) -> set[int]:
        if self.process is None or self.process.returncode is not None:
            return set()
        try:
            root = psutil.Process(self.process.pid)
            return {root.pid, *(child.pid for child in root.children(recursive=True))}
        except psutil.NoSuchProcess:
            return set()


async def _http(session: aiohttp.ClientSession, method: str, url: str, payload: Any = None) -> Any:
    async with session.request(method, url, json=payload) as reply:
        reply.raise_for_status()
        return await reply.json(content_type=None)


# --------------------------------------------------------------------------- measurements


class LoopMonitor:
    """How long the event loop was held, two ways, from a timer that wakes every 2 ms.

    Wall clock: how late the timer fired (includes waiting for a CPU on a saturated machine and for
    the GIL). Loop-thread CPU (``time.thread_time``) between two wakes: what the loop itself spent,
    i.e. real blocking, unaffected by other processes; the goal applies to it. Garbage collections
    on the loop's thread are timed apart (they are part of both figures). An interval in which the
    runtime ran its quiet-point full collection (``rollout.gc_policy``: right after the last live
    episode ended, so no episode waited for it) is counted apart too: ``max_busy_s`` is the longest
    of all, ``max_busy_in_flight_s`` the longest of the others.
    """

    PERIOD_S = 0.002

    def __init__(self) -> None:
        self.max_stall_s = 0.0
        self.max_stall_at_s = 0.0  # seconds into the phase when the longest stall ended
        self.stalls_over_50ms = 0
        self.max_busy_s = 0.0
        self.max_busy_at_s = 0.0
        self.busy_over_50ms = 0
        self.max_busy_in_flight_s = 0.0
        self.max_quiet_collection_s = 0.0  # loop-thread CPU of intervals with a quiet-point collection
        self.quiet_collections = 0
        self.max_gc_s = 0.0
        self.max_gc_in_flight_s = 0.0  # collections that started while an episode was live
        self.gc_over_50ms = 0
        self._gc_in_flight = False
        self._gc_started: float | None = None
        self._thread_id = threading.get_ident()
        self._task: asyncio.Task[None] | None = None

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        phase_start = loop.time()
        busy_before = time.thread_time()
        policy = gc_policy()
        collections_before = policy.quiet_collections
        while True:
            started = loop.time()
            await asyncio.sleep(self.PERIOD_S)
            now, busy_now = loop.time(), time.thread_time()
            stall = now - started - self.PERIOD_S
            busy, busy_before = busy_now - busy_before, busy_now
            collections_now = policy.quiet_collections
            if collections_now != collections_before:
                self.quiet_collections += collections_now - collections_before
                self.max_quiet_collection_s = max(self.max_quiet_collection_s, busy)
                collections_before = collections_now
            else:
                self.max_busy_in_flight_s = max(self.max_busy_in_flight_s, busy)
            self.stalls_over_50ms += stall > 0.05
            self.busy_over_50ms += busy > 0.05
            if stall > self.max_stall_s:
                self.max_stall_s, self.max_stall_at_s = stall, now - phase_start
            if busy > self.max_busy_s:
                self.max_busy_s, self.max_busy_at_s = busy, now - phase_start

    def _on_gc(self, phase: str, _info: dict[str, Any]) -> None:
        if threading.get_ident() != self._thread_id:
            return
        if phase == "start":
            self._gc_started = time.thread_time()
            self._gc_in_flight = gc_policy().live_episodes > 0
        elif self._gc_started is not None:
            pause = time.thread_time() - self._gc_started
            self.max_gc_s = max(self.max_gc_s, pause)
            if self._gc_in_flight:
                self.max_gc_in_flight_s = max(self.max_gc_in_flight_s, pause)
            self.gc_over_50ms += pause > 0.05
            self._gc_started = None

    def start(self) -> None:
        """Start watching the running loop."""
        self._thread_id = threading.get_ident()
        gc.callbacks.append(self._on_gc)
        self._task = asyncio.create_task(self._run())

    async def stop(self) -> float:
        """Stop watching; returns the longest wall-clock stall in seconds."""
        assert self._task is not None
        gc.callbacks.remove(self._on_gc)
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        return self.max_stall_s


def _process_resources(server_pids: set[int]) -> dict[str, float]:
    me = psutil.Process()
    children = [child for child in me.children(recursive=True) if child.pid not in server_pids]
    return {
        "rss_mb": round(me.memory_info().rss / 2**20, 1),
        "fds": me.num_fds(),
        "sockets": len(me.connections(kind="inet")),  # psutil >= 6 also names it net_connections
        "children": len(children),
    }


async def resources(server: ServerProcess) -> dict[str, float]:
    """RSS, descriptors, sockets, child processes (without the server's) and asyncio tasks.

    psutil scans /proc (about 20 ms of CPU): in a worker thread, so that the soak's own bookkeeping
    does not count as loop blocking.
    """
    tasks = len(asyncio.all_tasks())
    server_pids = await asyncio.to_thread(server.pids)
    return {**await asyncio.to_thread(_process_resources, server_pids), "tasks": tasks}


class SendLog:
    """When the client sent each ``/generate`` request, by routing key (the episode's session id).

    Recorded on the client side (aiohttp's ``on_request_headers_sent``), not from the server's log:
    the server stamps a request when its handler runs, which on a loaded machine can be long after
    the client sent it, so a request sent before an abort would count as sent after it. While
    ``installed``, every new ``aiohttp.ClientSession`` (the client's included) gets the trace config.
    """

    def __init__(self) -> None:
        self.sent: dict[str, list[float]] = defaultdict(list)

    async def _on_headers_sent(self, _session: Any, _context: Any, params: Any) -> None:
        key = params.headers.get("X-SMG-Routing-Key")
        if key and params.url.path == "/generate":
            self.sent[key].append(time.time())

    def count_after(self, key: str, moment: float) -> int:
        """Requests of episode ``key`` sent after ``moment`` (``time.time()``)."""
        return sum(sent > moment for sent in self.sent.get(key, []))

    @contextlib.contextmanager
    def installed(self) -> Iterator[None]:
        """Trace every ``aiohttp.ClientSession`` created inside the block."""
        trace = aiohttp.TraceConfig()
        trace.on_request_headers_sent.append(self._on_headers_sent)
        original = aiohttp.ClientSession.__init__

        def traced_init(session: aiohttp.ClientSession, *args: Any, **kwargs: Any) -> None:
            kwargs["trace_configs"] = [*(kwargs.get("trace_configs") or ()), trace]
            original(session, *args, **kwargs)

        aiohttp.ClientSession.__init__ = traced_init  # type: ignore[method-assign]
        try:
            yield
        finally:
            aiohttp.ClientSession.__init__ = original  # type: ignore[method-assign]


def invariant_problems(sample: Any) -> list[str]:
    """slime's invariants on a returned sample; an empty list means valid."""
    problems = []
    length = sample.response_length
    if not isinstance(length, int) or length < 1:
        problems.append(f"response_length {length!r} < 1")
    if not (len(sample.loss_mask or []) == len(sample.rollout_log_probs or []) == length):
        problems.append("len(loss_mask) == len(rollout_log_probs) == response_length broken")
    if len(sample.tokens or []) <= (length or 0):
        problems.append("tokens do not hold prompt + response")
    if any(mask not in (0, 1) for mask in sample.loss_mask or []):
        problems.append("loss_mask not 0/1")
    if any(not math.isfinite(lp) or lp > 0 for lp in sample.rollout_log_probs or []):
        problems.append("non-finite or positive logprob")
    status = status_name(sample)
    if status not in STATUSES:
        problems.append(f"status {status}")
    if status != "aborted" and sample.reward is None:
        problems.append("no reward")
    if sample.remove_sample and status != "failed":
        problems.append("removed but not FAILED")
    if status == "failed" and not EpisodeMetadata.from_metadata(sample.metadata).infra_error:
        problems.append("FAILED without infra_error")
    return problems


@dataclass
class Episode:
    sample: Any
    scenario: str
    step: int
    started: float = 0.0
    ended: float = 0.0
    error: str | None = None
    labels: set[str] = field(default_factory=set)


@dataclass
class SoakResults:
    escaped: list[str] = field(default_factory=list)
    loop_errors: list[str] = field(default_factory=list)
    invalid: list[str] = field(default_factory=list)
    unexplained_failures: list[str] = field(default_factory=list)  # FAILED without a server-side fault
    matrix: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    requests_after_abort: int = 0
    abort_returns_s: list[float] = field(default_factory=list)
    aborted_steps: int = 0
    stalls_s: dict[str, float] = field(default_factory=dict)  # wall clock, per phase
    busy_s: dict[str, float] = field(default_factory=dict)  # loop-thread CPU, per phase
    busy_in_flight_s: dict[str, float] = field(
        default_factory=dict
    )  # the same, quiet-point collections apart
    quiet_collections_s: dict[str, float] = field(default_factory=dict)  # intervals with one, per phase
    gc_pauses_s: dict[str, float] = field(default_factory=dict)  # longest collection on the loop's thread
    stall_details: dict[str, str] = field(default_factory=dict)
    checkpoints: list[dict[str, Any]] = field(default_factory=list)
    statuses: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))
    walls_s: dict[str, float] = field(default_factory=dict)
    requests: int = 0
    faults: Counter[str] = field(default_factory=Counter)
    server_aborts: int = 0
    server_aborted_requests: int = 0  # running + queued when abort_all was sent
    settings: dict[str, Any] = field(default_factory=dict)


# --------------------------------------------------------------------------- the soak


class Soak:
    def __init__(
        self,
        *,
        episodes: int,
        load_episodes: int,
        seed: int,
        concurrency: int,
        step_size: int,
        upstream: str | None = None,
        max_response_len: int = 2048,
        request_timeout_s: float = 5.0,
    ):
        self.upstream = upstream
        self.config = {**SOAK_CONFIG, "client": {**SOAK_CONFIG["client"], "timeout_s": request_timeout_s}}
        self.max_response_len = max_response_len
        self.sampling_params = sampling_params(
            RolloutOptions(data=Path("-"), out=Path("-"), max_response_len=max_response_len)
        )
        self.episodes = episodes
        self.load_episodes = load_episodes
        self.seed = seed
        self.concurrency = concurrency
        self.step_size = step_size
        self.rng = random.Random(seed)
        self.sends = SendLog()
        self.results = SoakResults()
        self.results.settings = {
            "episodes": episodes,
            "load_episodes": load_episodes,
            "seed": seed,
            "concurrency": concurrency,
            "step_size": step_size,
            "upstream": "real SGLang behind a fault proxy" if upstream else "scripted dev server",
            "max_response_len": max_response_len,
            "request_timeout_s": request_timeout_s,
            "load_average_at_start": [round(x, 1) for x in os.getloadavg()],
        }

    def _args(self, url: str, concurrency: int, abort_event: threading.Event) -> Any:
        options = RolloutOptions(
            data=Path("-"), out=Path("-"), concurrency=concurrency, max_response_len=self.max_response_len
        )
        args = slime_args(options, url, None)
        args.strands_slime = self.config
        args.abort_event = abort_event
        return args

    def _new_episode(self, step: int, scenario: str | None = None) -> Episode:
        if scenario is None:
            names = list(SCENARIOS)
            scenario = self.rng.choices(names, weights=[SCENARIOS[n][0] for n in names])[0]
        prompt = f"[soak:{scenario}] What is 17 * 2? Use Python. Answer: \\boxed{{}}."
        sample = Sample(prompt=prompt, label="34", index=0, group_index=step)
        sample.session_id = str(uuid.uuid4())
        return Episode(sample=sample, scenario=scenario, step=step)

    async def _run_episode(self, args: Any, episode: Episode, semaphore: asyncio.Semaphore) -> None:
        async with semaphore:
            episode.started = time.time()
            try:
                await generate(args, episode.sample, self.sampling_params)
                if episode.sample.reward is None and status_name(episode.sample) != "aborted":
                    episode.sample.reward = await reward_func(args, episode.sample)
            except Exception as exc:  # an escaped exception is what the soak hunts for
                episode.error = f"{type(exc).__name__}: {exc}"
            episode.ended = time.time()

    def _record(self, phase: str, episodes: list[Episode]) -> None:
        results = self.results
        for episode in episodes:
            if episode.error is not None:
                results.escaped.append(episode.error)
                continue
            sample = episode.sample
            status = status_name(sample)
            results.statuses[phase][status] += 1
            problems = invariant_problems(sample)
            if problems:
                results.invalid.append(f"{episode.scenario}: {', '.join(problems)}")
            if phase != "fault":
                continue
            labels = {episode.scenario, *episode.labels}
            metadata = EpisodeMetadata.from_metadata(sample.metadata)
            infra = str(metadata.infra_error or "")
            if metadata.abort_source == "server":
                labels.add("server abort (abort_all)")
            if labels == {episode.scenario}:
                labels.add("no fault (scenario only)")
            if status == "failed" and not labels - {episode.scenario, "no fault (scenario only)"}:
                results.unexplained_failures.append(f"{episode.scenario}: {infra[:200]}")
            for label in labels:
                results.matrix[label][status] += 1

    async def _step(
        self, server: ServerProcess, session: aiohttp.ClientSession, step: int, count: int, abort: bool
    ) -> None:
        abort_event = threading.Event()
        args = self._args(server.url, self.concurrency, abort_event)
        episodes = [self._new_episode(step) for _ in range(count)]
        semaphore = asyncio.Semaphore(self.concurrency)
        tasks = [asyncio.create_task(self._run_episode(args, e, semaphore)) for e in episodes]
        abort_at: float | None = None
        if abort:
            await asyncio.wait(tasks, timeout=self.rng.uniform(0.5, 2.0))
            abort_at = time.time()
            abort_event.set()
            self.results.aborted_steps += 1
        await asyncio.gather(*tasks)
        log = await _http(session, "GET", server.url + "/dev/requests")
        await _http(session, "DELETE", server.url + "/dev/requests")
        by_session: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for entry in log:
            self.results.requests += 1
            if entry.get("fault"):
                self.results.faults[entry["fault"]] += 1
            key = entry["headers"].get("X-SMG-Routing-Key")
            if key:
                by_session[key].append(entry)
        for episode in episodes:
            for entry in by_session.get(episode.sample.session_id, []):
                if entry.get("fault"):
                    episode.labels.add(FAULT_NAMES.get(entry["fault"], entry["fault"]))
            if abort_at is not None and not (episode.started and episode.started < abort_at):
                episode.labels.add("slime abort (not started yet)")
            elif abort_at is not None:
                episode.labels.add(
                    "slime abort (running)" if episode.ended > abort_at else "slime abort (done before)"
                )
                if episode.ended > abort_at:
                    self.results.abort_returns_s.append(episode.ended - abort_at)
                    self.results.requests_after_abort += self.sends.count_after(
                        episode.sample.session_id, abort_at
                    )
        self._record("fault", episodes)

    async def _server_aborts(self, server: ServerProcess, session: aiohttp.ClientSession) -> None:
        """Every few seconds, once requests are running or queued, abort them all (as a weight update does)."""
        while True:
            await asyncio.sleep(self.rng.uniform(3.0, 8.0))
            live = 0
            while not live:  # until requests are live (the server may be down: killed and restarting)
                with contextlib.suppress(aiohttp.ClientError, OSError, KeyError, IndexError):
                    load = (await _http(session, "GET", server.url + "/v1/loads"))["loads"][0]
                    live = load["num_running_reqs"] + load["num_waiting_reqs"]
                if not live:
                    await asyncio.sleep(0.01)
            with contextlib.suppress(aiohttp.ClientError, OSError):
                await _http_no_json(session, server.url + "/abort_request", {"rid": "", "abort_all": True})
                self.results.server_aborts += 1
                self.results.server_aborted_requests += live

    async def _kill_and_restart(
        self, server: ServerProcess, session: aiohttp.ClientSession
    ) -> tuple[float, float]:
        """SIGKILL the server, start it again on the same port; returns when it went down and came back."""
        killed_at = time.time()
        await server.kill()
        await asyncio.sleep(1.5)
        await server.start()  # seconds more on a loaded machine: the outage is longer than the sleep
        await _http(
            session, "POST", server.url + "/dev/fault_mix", {"faults": FAULT_MIX, "seed": self.seed + 1}
        )
        return killed_at, time.time()

    async def fault_phase(self, server: ServerProcess, session: aiohttp.ClientSession) -> None:
        await _http(session, "POST", server.url + "/dev/fault_mix", {"faults": FAULT_MIX, "seed": self.seed})
        monitor = LoopMonitor()
        monitor.start()
        aborter = asyncio.create_task(self._server_aborts(server, session))
        started = time.perf_counter()
        steps = max(1, math.ceil(self.episodes / self.step_size))
        kill_step = steps // 2
        done = 0
        for step in range(steps):
            count = min(self.step_size, self.episodes - done)
            if step == kill_step:
                await self._step_with_kill(server, session, step, count)
            else:
                await self._step(server, session, step, count, abort=step % 3 == 2)
            done += count
            point = await self._idle_resources(server)
            self.results.checkpoints.append({"phase": "fault", "episodes": done, **point})
        aborter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await aborter
        self.results.walls_s["fault"] = round(time.perf_counter() - started, 1)
        self.results.stalls_s["fault"] = await monitor.stop()
        self.results.busy_s["fault"] = monitor.max_busy_s
        self.results.busy_in_flight_s["fault"] = monitor.max_busy_in_flight_s
        self.results.quiet_collections_s["fault"] = monitor.max_quiet_collection_s
        self.results.gc_pauses_s["fault"] = monitor.max_gc_s
        self.results.stall_details["fault"] = _stall_detail(monitor)

    async def _idle_resources(self, server: ServerProcess) -> dict[str, float]:
        """Resources once the step's last processes are gone (at most 5 s later).

        A just-finished execution's worker, or a pre-forked one on its way, can be alive for a moment
        on a loaded machine; a leak stays. Compared with the first fault-phase checkpoint.
        """
        point = await resources(server)
        baseline = next((p for p in self.results.checkpoints if p["phase"] == "fault"), None)
        deadline = time.monotonic() + 5.0
        while (
            baseline is not None and point["children"] > baseline["children"] and time.monotonic() < deadline
        ):
            await asyncio.sleep(0.1)
            point = await resources(server)
        return point

    async def _step_with_kill(
        self, server: ServerProcess, session: aiohttp.ClientSession, step: int, count: int
    ) -> None:
        """A step during which the server is SIGKILLed and restarted (its request log dies with it)."""
        abort_event = threading.Event()
        args = self._args(server.url, self.concurrency, abort_event)
        episodes = [self._new_episode(step) for _ in range(count)]
        semaphore = asyncio.Semaphore(self.concurrency)
        tasks = [asyncio.create_task(self._run_episode(args, e, semaphore)) for e in episodes]
        await asyncio.wait(tasks, timeout=1.0)
        killed_at, restarted_at = await self._kill_and_restart(server, session)
        await asyncio.gather(*tasks)
        for episode in episodes:  # running at some point while the server was down
            if episode.started <= restarted_at and episode.ended >= killed_at:
                episode.labels.add("server kill")
        await _http(session, "DELETE", server.url + "/dev/requests")
        self._record("fault", episodes)

    async def load_phase(self, server: ServerProcess, session: aiohttp.ClientSession) -> None:
        await _http(
            session, "POST", server.url + "/dev/fault_mix", {"faults": LOAD_LATENCY_MIX, "seed": self.seed}
        )
        abort_event = threading.Event()
        args = self._args(server.url, self.load_episodes, abort_event)
        episodes = [self._new_episode(0, "tool: normal") for _ in range(self.load_episodes)]
        semaphore = asyncio.Semaphore(self.load_episodes)
        monitor = LoopMonitor()
        monitor.start()
        started = time.perf_counter()
        await asyncio.gather(*(self._run_episode(args, e, semaphore) for e in episodes))
        self.results.walls_s["load"] = round(time.perf_counter() - started, 1)
        self.results.stalls_s["load"] = await monitor.stop()
        self.results.busy_s["load"] = monitor.max_busy_s
        self.results.busy_in_flight_s["load"] = monitor.max_busy_in_flight_s
        self.results.quiet_collections_s["load"] = monitor.max_quiet_collection_s
        self.results.gc_pauses_s["load"] = monitor.max_gc_s
        self.results.stall_details["load"] = _stall_detail(monitor)
        await _http(session, "DELETE", server.url + "/dev/requests")
        self._record("load", episodes)
        point = {"phase": "load", "episodes": self.episodes + self.load_episodes, **await resources(server)}
        self.results.checkpoints.append(point)

    async def run(self) -> SoakResults:
        # Strands logs every episode-ending exception (budget, tool limit) at ERROR: expected here
        logging.getLogger("strands.event_loop").setLevel(logging.CRITICAL)
        loop = asyncio.get_running_loop()
        loop.set_exception_handler(
            lambda _loop, context: self.results.loop_errors.append(str(context.get("message")))
        )
        # Inside slime the tokenizer is GenerateState's, loaded before any rollout starts; parsing it
        # holds the GIL for ~1 s, which would show up as a loop stall that slime never sees.
        await asyncio.to_thread(load_tokenizer, None)
        with self.sends.installed(), tempfile.TemporaryDirectory(prefix="soak-") as tmp:
            script = Path(tmp) / "script.json"
            script.write_text(json.dumps(soak_script()))
            # 8 generate at once, token by token: the server's aborts hit running and queued requests
            upstream = ["--upstream", self.upstream] if self.upstream else []
            fault_server = ServerProcess(
                script, ["--max-running-requests", "8", "--token-latency", "0.003", *upstream]
            )
            await fault_server.start()
            timeout = aiohttp.ClientTimeout(total=60)
            async with aiohttp.ClientSession(timeout=timeout) as session:
                try:
                    self.results.checkpoints.append(
                        {"phase": "start", "episodes": 0, **await resources(fault_server)}
                    )
                    if self.episodes:
                        await self.fault_phase(fault_server, session)
                finally:
                    await fault_server.stop()
                if self.load_episodes:
                    load_server = ServerProcess(
                        script, ["--max-running-requests", str(max(1024, self.load_episodes)), *upstream]
                    )
                    await load_server.start()
                    try:
                        await self.load_phase(load_server, session)
                    finally:
                        await load_server.stop()
        return self.results


def _stall_detail(monitor: LoopMonitor) -> str:
    return (
        f"loop-thread CPU max {monitor.max_busy_s * 1000:.0f} ms at {monitor.max_busy_at_s:.1f} s into the "
        f"phase, {monitor.busy_over_50ms} over 50 ms; wall-clock stall max {monitor.max_stall_s * 1000:.0f} ms "
        f"at {monitor.max_stall_at_s:.1f} s, {monitor.stalls_over_50ms} over 50 ms; longest garbage collection "
        f"{monitor.max_gc_s * 1000:.0f} ms, {monitor.gc_over_50ms} over 50 ms (with an episode live "
        f"{monitor.max_gc_in_flight_s * 1000:.0f} ms); with episodes in flight "
        f"loop-thread CPU max {monitor.max_busy_in_flight_s * 1000:.0f} ms; {monitor.quiet_collections} "
        f"quiet-point full collections, the longest interval with one {monitor.max_quiet_collection_s * 1000:.0f} ms"
    )


async def _http_no_json(session: aiohttp.ClientSession, url: str, payload: Any) -> None:
    async with session.post(url, json=payload) as reply:
        reply.raise_for_status()


async def run_soak(
    *,
    episodes: int = 3000,
    load_episodes: int = 1024,
    seed: int = 0,
    concurrency: int = 64,
    step_size: int = 100,
    upstream: str | None = None,
    max_response_len: int = 2048,
    request_timeout_s: float = 5.0,
) -> SoakResults:
    return await Soak(
        episodes=episodes,
        load_episodes=load_episodes,
        seed=seed,
        concurrency=concurrency,
        step_size=step_size,
        upstream=upstream,
        max_response_len=max_response_len,
        request_timeout_s=request_timeout_s,
    ).run()


# --------------------------------------------------------------------------- report


def _percentile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def summarize(results: SoakResults) -> dict[str, Any]:
    fault_points = [p for p in results.checkpoints if p.get("phase") == "fault"]
    # from the first idle point after warm-up (pools, sandbox, tokenizer exist) to the last one
    first = fault_points[0] if fault_points else results.checkpoints[0]
    last = fault_points[-1] if fault_points else results.checkpoints[-1]
    trend = {
        key: round(last[key] - first[key], 1) for key in ("rss_mb", "fds", "sockets", "children", "tasks")
    }
    # pooled keep-alive connections may grow up to the pool size; other descriptors must not grow
    trend["fds other than sockets"] = trend.pop("fds") - trend["sockets"]
    p50 = statistics.median(results.abort_returns_s) if results.abort_returns_s else None
    worst = max(results.abort_returns_s) if results.abort_returns_s else None
    stall = max(results.stalls_s.values()) if results.stalls_s else 0.0
    busy = max(results.busy_s.values()) if results.busy_s else 0.0
    in_flight = max(results.busy_in_flight_s.values()) if results.busy_in_flight_s else 0.0
    quiet = max(results.quiet_collections_s.values()) if results.quiet_collections_s else 0.0
    goals = {
        "escaped exceptions": (len(results.escaped) + len(results.loop_errors), "0"),
        "invalid samples": (len(results.invalid), "0"),
        "FAILED without a server-side fault": (len(results.unexplained_failures), "0"),
        "requests after abort": (results.requests_after_abort, "0"),
        "abort → return p50 / max (s)": (f"{_fmt(p50)} / {_fmt(worst)}", "≤ 1"),
        "loop blocking max with episodes in flight, loop-thread CPU (ms)": (
            round(in_flight * 1000, 1),
            "≤ 50",
        ),
        "loop blocking at a quiet-point full collection (no episode in flight; ms)": (
            round(quiet * 1000, 1),
            "reported",
        ),
        "loop blocking max overall, loop-thread CPU (ms)": (round(busy * 1000, 1), "reported"),
        "loop stall max, wall clock (ms)": (round(stall * 1000, 1), "reported (includes waiting for a CPU)"),
        "resources (fault phase, first idle → last)": (
            ", ".join(f"{k} {v:+g}" for k, v in trend.items()),
            "flat",
        ),
    }
    met = {
        "escaped exceptions": goals["escaped exceptions"][0] == 0,
        "invalid samples": goals["invalid samples"][0] == 0,
        "FAILED without a server-side fault": not results.unexplained_failures,
        "requests after abort": results.requests_after_abort == 0,
        "abort → return p50 / max (s)": worst is None or worst <= 1.0,
        "loop blocking max with episodes in flight, loop-thread CPU (ms)": in_flight <= 0.05,
        "loop blocking at a quiet-point full collection (no episode in flight; ms)": None,
        "loop blocking max overall, loop-thread CPU (ms)": None,
        "loop stall max, wall clock (ms)": None,
        "resources (fault phase, first idle → last)": trend["fds other than sockets"] <= 5
        and last["sockets"] <= results.settings["concurrency"] + 8
        and trend["children"] <= 0
        and trend["tasks"] <= 0
        and trend["rss_mb"] <= 200,
    }
    return {
        "goals": goals,
        "met": met,
        "trend": trend,
        "p50": p50,
        "max": worst,
        "stall": stall,
        "busy": busy,
        "busy_in_flight": in_flight,
        "quiet_collection": quiet,
    }


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def render_text(results: SoakResults) -> str:
    summary = summarize(results)
    lines = [f"soak: {json.dumps(results.settings)}"]
    for name, (value, goal) in summary["goals"].items():
        mark = {True: "ok ", False: "MISS", None: "info"}[summary["met"][name]]
        lines.append(f"  [{mark}] {name}: {value} (goal {goal})")
    lines.append(
        f"  fault phase: {results.walls_s.get('fault', 0)} s, {results.requests} requests logged, "
        f"{sum(results.faults.values())} faulted, {results.server_aborts} server abort_all "
        f"({results.server_aborted_requests} requests live), "
        f"{results.aborted_steps} slime-aborted steps; load phase: {results.walls_s.get('load', 0)} s"
    )
    for phase, detail in results.stall_details.items():
        lines.append(f"  event loop, {phase} phase: {detail}")
    for error in Counter(results.escaped + results.loop_errors).most_common(5):
        lines.append(f"  escaped: {error[1]} x {error[0][:200]}")
    for problem in Counter(results.invalid + results.unexplained_failures).most_common(5):
        lines.append(f"  invalid: {problem[1]} x {problem[0]}")
    lines.append(render_matrix(results))
    return "\n".join(lines)


def render_matrix(results: SoakResults) -> str:
    lines = ["| fault / scenario (episodes that met it) | " + " | ".join(STATUSES) + " |"]
    lines.append("|---|" + "---:|" * len(STATUSES))
    for label in sorted(results.matrix):
        counts = results.matrix[label]
        lines.append(f"| {label} | " + " | ".join(str(counts[s]) for s in STATUSES) + " |")
    return "\n".join(lines)


EXPECTED_OUTCOMES = """What each fault should lead to (docs/rollout.md, "Statuses"). An episode is counted on every row it
met (its scenario plus each fault its requests drew), so a row's failures may come from another fault
on the same episode; the soak checks that no episode FAILED without a server-side fault.

| fault / scenario | expected |
|---|---|
| 503 / 500 bursts, dropped connections, resets mid-body, truncated JSON, slow replies | retried by the client: COMPLETED/TRUNCATED as without the fault; FAILED (removed, `infra_error`) only when the retries run out |
| hanging reply (20 s) | the request times out (`client.timeout_s` 5 s in the soak), then as above |
| 400 context error | TRUNCATED (`metadata.truncation = context_length`), never retried |
| server `abort_all` (running or queued) | ABORTED, no reward, `metadata.abort_source = "server"` (as slime's own generate: fully-async rollouts requeue it, the dynamic-sampling filter drops its group) |
| server killed and restarted | connection errors are retried: COMPLETED once the server is back, FAILED if it stays down past the retry budget |
| slime abort (`args.abort_event`) | ABORTED, no reward; episodes that had not started return ABORTED at once |
| malformed tool call | the parse error goes back to the model: COMPLETED |
| crashing / looping / flooding / forking tool code | the sandbox reports the error, timeout or clipped output: COMPLETED, or TRUNCATED when the clipped output fills the response budget (flood); forked children are reaped |
| tool loop | TRUNCATED at `max_tool_iters` (`metadata.truncation = tool_limit`) |"""


def render_markdown(results: SoakResults, note: str = "") -> str:
    summary = summarize(results)
    settings = results.settings
    machine = f"{platform.node()} ({platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()})"
    lines = [
        "# Fault-injection soak (`make soak`)",
        "",
        "`benchmarks/soak.py` drives `strands_slime.generate` (and `reward_func`) the way slime's rollout",
        "does, against the scripted dev server in a child process, with a seeded fault per request. The test",
        "suite runs a 300-episode version (`tests/test_soak.py`); the full soak is run by hand.",
        "",
        "Loop blocking is the CPU time of the event loop's thread between two wakes of a 2 ms timer: what",
        "our code (and the garbage collector, timed apart) held the loop for, unaffected by other processes.",
        "The wall-clock stall (how late that timer fired) is reported next to it; on a shared machine it also",
        "counts waiting for a CPU. With `gc_tuning` (the default) the runtime runs its full garbage",
        "collection right after the last live episode of a step ends (docs/rollout.md); the loop intervals",
        "holding one are reported apart, since no episode was in flight to wait for them; the goal applies to",
        "every other interval.",
        "",
        f"Last full run: {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC on {machine}; "
        f"{settings['episodes']:,} fault-phase episodes in steps of {settings['step_size']} at concurrency "
        f"{settings['concurrency']}, then {settings['load_episodes']:,} load-phase episodes at once; seed "
        f"{settings['seed']}. The machine is shared: 1/5/15-min load average "
        f"{'/'.join(str(x) for x in settings['load_average_at_start'])} at the start. {note}".rstrip(),
        "",
        "## Results",
        "",
        "| measure | result | goal | met |",
        "|---|---|---|---|",
    ]
    for name, (value, goal) in summary["goals"].items():
        met = {True: "yes", False: "**no**", None: "–"}[summary["met"][name]]
        lines.append(f"| {name} | {value} | {goal} | {met} |")
    lines += [
        "",
        f"Fault phase: {results.walls_s.get('fault', 0)} s, {results.requests:,} `/generate` requests "
        f"logged (the killed server's log is lost), {sum(results.faults.values()):,} faulted, "
        f"{results.server_aborts} server `abort_all`, {results.aborted_steps} slime-aborted steps; statuses "
        f"{dict(results.statuses.get('fault', {}))}. Load phase: {results.walls_s.get('load', 0)} s, statuses "
        f"{dict(results.statuses.get('load', {}))}. Event loop: "
        + "; ".join(f"{k} phase {v}" for k, v in results.stall_details.items())
        + ".",
        "",
    ]
    if results.escaped or results.loop_errors or results.invalid:
        lines += ["Escaped exceptions / invalid samples:", ""]
        for error, count in Counter(results.escaped + results.loop_errors + results.invalid).most_common(10):
            lines.append(f"- {count} x `{error[:200]}`")
        lines.append("")
    lines += ["## Fault → status", "", EXPECTED_OUTCOMES, "", render_matrix(results), ""]
    lines += [
        "## Resources at idle points",
        "",
        "| phase | episodes | RSS MB | fds | sockets | children | asyncio tasks |",
    ]
    lines.append("|---|---:|---:|---:|---:|---:|---:|")
    for point in results.checkpoints:
        lines.append(
            f"| {point['phase']} | {point['episodes']:,} | {point['rss_mb']} | {point['fds']} | {point['sockets']} "
            f"| {point['children']} "
            f"| {point['tasks']} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--episodes", type=int, default=3000, help="fault-phase episodes")
    parser.add_argument("--load-episodes", type=int, default=1024, help="load-phase episodes, all at once")
    parser.add_argument("--concurrency", type=int, default=64, help="fault-phase episodes in flight")
    parser.add_argument("--step-size", type=int, default=100, help="episodes per rollout step")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--write-doc", action="store_true", help=f"rewrite {DOC_PATH.relative_to(REPO_ROOT)}")
    parser.add_argument("--note", default="", help="a sentence for the doc (e.g. a reduced run and why)")
    parser.add_argument("--json", type=Path, help="also write the raw results here")
    parser.add_argument(
        "--upstream",
        metavar="URL",
        help="run against this real SGLang server through a fault proxy (the same fault mix, server "
        "aborts and proxy kill) instead of the scripted dev server",
    )
    parser.add_argument(
        "--max-response-len", type=int, default=2048, help="the episode budget (small against a CPU SGLang)"
    )
    parser.add_argument(
        "--request-timeout",
        type=float,
        default=5.0,
        help="the client's timeout_s (below the 20 s hang the mix injects; a CPU SGLang needs more than 5)",
    )
    ns = parser.parse_args(argv)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    results = asyncio.run(
        run_soak(
            episodes=ns.episodes,
            load_episodes=ns.load_episodes,
            seed=ns.seed,
            concurrency=ns.concurrency,
            step_size=ns.step_size,
            upstream=ns.upstream,
            max_response_len=ns.max_response_len,
            request_timeout_s=ns.request_timeout,
        )
    )
    print(render_text(results))
    if ns.json:
        ns.json.write_text(json.dumps({k: v for k, v in vars(results).items()}, default=_jsonable, indent=1))
    if ns.write_doc:
        DOC_PATH.write_text(render_markdown(results, ns.note))
        print(f"wrote {DOC_PATH}")
    return 0 if all(met is not False for met in summarize(results)["met"].values()) else 1


def _jsonable(value: Any) -> Any:
    return dict(value) if isinstance(value, dict) else sorted(value) if isinstance(value, set) else str(value)


if __name__ == "__main__":
    sys.exit(main())
