"""One measured run of the provider benchmark: N concurrent Strands episodes through one provider.

    python benchmarks/provider_driver.py --provider ours|peer|floor --url URL \
        --transcripts FILE --concurrency N --episodes E --out result.json

Runs in its own process so its CPU time (``time.process_time``: every thread of the process) is the
provider's and Strands' cost alone; the dev server runs in another process. Both providers run in
the same interpreter (the peer venv, Python 3.12) with the same tokenizer object type, tool, agent
settings and sampling parameters.

Providers:
  ours   strands_slime.provider.model.SGLangModel
  peer   strands_sglang.SGLangModel (0.6.2)
  floor  the same agent loop with an in-process scripted Strands model: no HTTP, no tokenizer. What
         any provider pays for Strands itself.
``ours`` runs as README's "Use the provider directly" writes it (``--ours-setup readme``, the default):
``rollout_settings()`` once at start-up (Strands' tracer guard, the rollout's GC policy), the client's
``decode_scope``, the model's ``pace``, ``settings.episode()`` around each episode and the model's
plugin: what ``strands_slime.generate`` gives its episodes. ``--no-rollout-gc`` asks for
``rollout_settings(gc_tuning=False)``; ``--ours-setup bare`` is ``Agent(model=SGLangModel(...))`` with
none of it; ``--no-fast-tokenizer`` runs ours as if the fast-tokenizer extra were not installed. The
peer and the floor keep CPython's GC defaults.
``--strands-patches`` applies the two patches of strands-notes §6 (no telemetry serialization when
no span records; no deep copy in ``_normalize_messages``) to show which part of the cost is Strands'.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import itertools
import json
import os
import statistics
import sys
import time
from collections import Counter
from collections.abc import AsyncGenerator, Callable, Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import transcripts as transcript_data

PROVIDERS = ("ours", "peer", "floor")
MAX_NEW_TOKENS = 4096
"""Set explicitly for both providers (the peer never sets it, so SGLang's default of 128 would apply)."""
TICK_S = 0.001
RSS_EVERY_S = 0.05
WARMUP_EPISODES = 8
TIMELINE_EVERY_S = 0.25


# --------------------------------------------------------------------------- Strands patches


def apply_strands_patches() -> None:
    """strands-notes §6: skip OpenTelemetry message serialization when the span does not record, and
    hand the model the messages without a deep copy (their blank-text fixes never apply here)."""
    from strands.event_loop import streaming
    from strands.telemetry.tracer import Tracer

    original = Tracer._add_event_messages

    def add_event_messages(self: Any, span: Any, messages: Any) -> None:
        if span is None or not span.is_recording():
            return
        original(self, span, messages)

    Tracer._add_event_messages = add_event_messages  # type: ignore[method-assign]
    streaming._normalize_messages = lambda messages: messages  # type: ignore[assignment]


# --------------------------------------------------------------------------- the tool


def make_tool(outputs: dict[str, str], misses: Counter[str]) -> Any:
    from strands import tool

    @tool(name=transcript_data.TOOL_NAME)
    async def execute_python_code(code: str) -> str:
        """Execute Python code and return what it prints.

        Args:
            code: The program to run.
        """
        output = outputs.get(code)
        if output is None:
            misses["unknown code"] += 1
            return "NameError: this cell is not part of the benchmark transcripts"
        return output

    return execute_python_code


# --------------------------------------------------------------------------- the floor model


def make_floor_model_class() -> type:
    """A Strands model that replays the transcript in process (no HTTP, no tokenizer)."""
    from strands.models.model import Model

    class ScriptedStrandsModel(Model):
        def __init__(self, turns: list[dict[str, Any]]) -> None:
            self.config: dict[str, Any] = {"model_id": "scripted"}
            self.turns = [_floor_turn(turn) for turn in turns]
            self.calls = 0

        def update_config(self, **model_config: Any) -> None:
            self.config.update(model_config)

        def get_config(self) -> dict[str, Any]:
            return self.config

        def structured_output(self, *args: Any, **kwargs: Any) -> Any:  # type: ignore[override]
            raise NotImplementedError

        async def stream(self, messages: Any, *args: Any, **kwargs: Any) -> AsyncGenerator[Any, None]:
            text, calls = self.turns[min(self.calls, len(self.turns) - 1)]
            index = self.calls
            self.calls += 1
            yield {"messageStart": {"role": "assistant"}}
            yield {"contentBlockStart": {"start": {}}}
            yield {"contentBlockDelta": {"delta": {"text": text}}}
            yield {"contentBlockStop": {}}
            for call_index, payload in enumerate(calls):
                tool_use_id = f"call_{index:04d}_{call_index}"
                yield {
                    "contentBlockStart": {
                        "start": {"toolUse": {"name": transcript_data.TOOL_NAME, "toolUseId": tool_use_id}}
                    }
                }
                yield {"contentBlockDelta": {"delta": {"toolUse": {"input": payload}}}}
                yield {"contentBlockStop": {}}
            yield {"messageStop": {"stopReason": "tool_use" if calls else "end_turn"}}
            yield {"metadata": {"usage": {"inputTokens": 0, "outputTokens": 0, "totalTokens": 0}}}

    return ScriptedStrandsModel


def _floor_turn(turn: dict[str, Any]) -> tuple[str, list[str]]:
    reply = turn["reply"]
    cut = reply.find("<tool_call>")
    text = reply if cut == -1 else reply[:cut].rstrip()
    return text, [json.dumps({"code": call["code"]}) for call in turn["calls"]]


# --------------------------------------------------------------------------- providers


class Provider:
    """Builds one model per episode and reads its trajectory length."""

    def __init__(
        self,
        name: str,
        url: str | None,
        max_connections: int,
        rollout_gc: bool = False,
        setup: str = "readme",
    ) -> None:
        self.name = name
        self.client: Any = None
        self.episode_scope: Callable[[], Any] = contextlib.nullcontext
        """Entered around each episode (ours as the README writes it: ``settings.episode``)."""
        self.plugin = False
        """Whether the agent gets ``plugins=[model.plugin()]`` (ours as the README writes it)."""
        if name == "floor":
            self._floor_class = make_floor_model_class()
            return
        from strands_slime.provider.tokenizer import load_tokenizer

        self.tokenizer = load_tokenizer()
        sampling = {"max_new_tokens": MAX_NEW_TOKENS}
        if name == "ours":
            from strands_slime.provider.client import SGLangClient
            from strands_slime.provider.model import SGLangModel

            wiring: dict[str, Any] = {}
            client_wiring: dict[str, Any] = {}
            if setup == "readme":  # README, "Use the provider directly": what generate gives its episodes
                from strands_slime import rollout_settings

                settings = rollout_settings(gc_tuning=rollout_gc)
                wiring["pace"] = settings.pace
                client_wiring["decode_scope"] = settings.decode_scope
                self.episode_scope = settings.episode
                self.plugin = True
            self.client = SGLangClient(url, max_connections=max_connections, **client_wiring)  # type: ignore[arg-type]
            self._build: Callable[[dict[str, Any]], Any] = lambda _t: SGLangModel(
                self.tokenizer, "hermes", self.client, sampling_params=sampling, **wiring
            )
        elif name == "peer":
            from strands_sglang import SGLangClient as PeerClient
            from strands_sglang import SGLangModel as PeerModel
            from strands_sglang.tool_parsers import HermesToolParser

            self.client = PeerClient(url, max_connections=max_connections)  # type: ignore[arg-type]
            self._build = lambda _t: PeerModel(
                client=self.client,
                tokenizer=self.tokenizer,
                tool_parser=HermesToolParser(),
                sampling_params=dict(sampling),
            )
        else:
            raise ValueError(f"unknown provider {name!r} (expected one of {', '.join(PROVIDERS)})")

    def model(self, transcript: dict[str, Any]) -> Any:
        if self.name == "floor":
            return self._floor_class(transcript["turns"])
        return self._build(transcript)

    def trajectory_tokens(self, model: Any) -> int:
        if self.name == "ours":
            return len(model.trajectory)
        if self.name == "peer":
            return len(model.rollout.token_ids)
        return 0

    async def close(self) -> None:
        if self.client is not None:
            await self.client.close()


# --------------------------------------------------------------------------- measurement


class LoadMonitor:
    """A 1 ms ticker: event-loop lateness of every tick, and peak RSS sampled every 50 ms."""

    def __init__(self) -> None:
        import psutil

        self._process = psutil.Process()
        self.lags: list[float] = []
        self.peak_rss = 0
        self._stop = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def rss(self) -> int:
        return int(self._process.memory_info().rss)

    def start(self) -> None:
        self.peak_rss = self.rss()
        self._task = asyncio.ensure_future(self._run())

    async def _run(self) -> None:
        next_rss = time.perf_counter() + RSS_EVERY_S
        while not self._stop.is_set():
            started = time.perf_counter()
            await asyncio.sleep(TICK_S)
            now = time.perf_counter()
            self.lags.append(max(0.0, now - started - TICK_S))
            if now >= next_rss:
                self.peak_rss = max(self.peak_rss, self.rss())
                next_rss = now + RSS_EVERY_S

    async def stop(self) -> None:
        self._stop.set()
        if self._task is not None:
            await self._task
        self.peak_rss = max(self.peak_rss, self.rss())


class GcTimer:
    """CPU seconds the cyclic garbage collector used (gc.callbacks). Thread CPU time, not wall time: on a
    shared core the tokenizer thread may run while a collection holds the GIL."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self.collections = 0
        self.by_generation = [0.0, 0.0, 0.0]
        self.count_by_generation = [0, 0, 0]
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._started = time.thread_time()
        else:
            spent = time.thread_time() - self._started
            self.seconds += spent
            self.collections += 1
            self.by_generation[info["generation"]] += spent
            self.count_by_generation[info["generation"]] += 1


async def sample_timeline(
    timeline: list[tuple[float, float, int, int]], outcome: dict[str, Any], monitor: LoadMonitor
) -> None:
    """(wall clock, process CPU, model calls made so far, ticks) every TIMELINE_EVERY_S: lets a
    harness take CPU per turn over a window that another driver ran in at the same time."""
    while True:
        timeline.append((time.time(), time.process_time(), outcome["calls_so_far"], len(monitor.lags)))
        await asyncio.sleep(TIMELINE_EVERY_S)


async def calibrate_ticker(seconds: float = 0.3) -> float:
    """CPU seconds one tick of the idle 1 ms ticker costs. At low turn rates the ticker wakes the loop
    ~1000 times a second; that cost is the monitor's, not the provider's, so it is subtracted."""
    monitor = LoadMonitor()
    started = time.process_time()
    monitor.start()
    await asyncio.sleep(seconds)
    await monitor.stop()
    return (time.process_time() - started) / max(1, len(monitor.lags))


def _percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def episode_indices(count: int, until: float | None) -> Iterator[int]:
    """Each episode once; with ``until`` (a ``time.time()``), round after round until then instead."""
    if until is None:
        yield from range(count)
        return
    for index in itertools.count():
        if time.time() >= until:
            return
        yield index


async def run_episodes(
    provider: Provider,
    tool: Any,
    episodes: list[dict[str, Any]],
    concurrency: int,
    outcome: dict[str, Any],
    until: float | None = None,
) -> None:
    """Run every episode (or round after round until ``until``), at most ``concurrency`` at once;
    record calls, tokens and errors."""
    from strands import Agent
    from strands.agent.conversation_manager import NullConversationManager
    from strands.hooks import AfterModelCallEvent

    indices = episode_indices(len(episodes), until)

    def count_call(_event: Any) -> None:
        outcome["calls_so_far"] += 1

    async def run_one(index: int) -> None:
        transcript = episodes[index % len(episodes)]
        model = provider.model(transcript)
        agent = Agent(
            model=model,
            tools=[tool],
            system_prompt=transcript_data.SYSTEM_PROMPT,
            callback_handler=None,
            conversation_manager=NullConversationManager(),
            retry_strategy=None,
            plugins=[model.plugin()] if provider.plugin else [],  # as the README writes it
        )
        agent.add_hook(count_call, AfterModelCallEvent)
        try:
            with provider.episode_scope():
                result = await agent.invoke_async(
                    transcript["prompt"], invocation_state={}, limits={"turns": len(transcript["turns"]) + 4}
                )
        except Exception as exc:
            outcome["errors"][f"{type(exc).__name__}: {str(exc)[:200]}"] += 1
            calls = sum(1 for m in agent.messages if m["role"] == "assistant")
            outcome["model_calls"] += calls
            return
        calls = sum(1 for m in agent.messages if m["role"] == "assistant")
        outcome["model_calls"] += calls
        if calls != len(transcript["turns"]) or result.stop_reason != "end_turn":
            outcome["errors"][f"episode off script: {calls} calls, stop {result.stop_reason}"] += 1
        outcome["tokens"][index] = provider.trajectory_tokens(model)

    async def worker() -> None:
        for index in indices:
            await run_one(index)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def assemble_message(events: Any) -> tuple[list[dict[str, Any]], str]:
    """The assistant message Strands would build from a provider's stream events, and the stop reason."""
    content: list[dict[str, Any]] = []
    block: dict[str, Any] | None = None
    stop = "end_turn"
    async for event in events:
        if "contentBlockStart" in event:
            start = event["contentBlockStart"].get("start") or {}
            block = {"toolUse": {**start["toolUse"], "input": ""}} if "toolUse" in start else {}
        elif "contentBlockDelta" in event:
            delta = event["contentBlockDelta"]["delta"]
            block = {} if block is None else block
            if "toolUse" in delta:
                block["toolUse"]["input"] += delta["toolUse"]["input"]
            elif "reasoningContent" in delta:
                block["reasoning"] = block.get("reasoning", "") + delta["reasoningContent"].get("text", "")
            elif "text" in delta:
                block["text"] = block.get("text", "") + delta["text"]
        elif "contentBlockStop" in event and block is not None:
            if "toolUse" in block:
                use = block["toolUse"]
                content.append({"toolUse": {**use, "input": json.loads(use["input"] or "{}")}})
            elif "reasoning" in block:
                content.append({"reasoningContent": {"reasoningText": {"text": block["reasoning"]}}})
            elif "text" in block:
                content.append({"text": block["text"]})
            block = None
        elif "messageStop" in event:
            stop = event["messageStop"]["stopReason"]
    return content, stop


async def run_episodes_without_strands(
    provider: Provider,
    tool: Any,
    outputs: dict[str, str],
    episodes: list[dict[str, Any]],
    concurrency: int,
    outcome: dict[str, Any],
    until: float | None = None,
) -> None:
    """The same episodes with the provider's ``stream()`` called directly: a minimal loop that builds
    the messages Strands would pass (no deep copies, telemetry, hooks or tool executor), so the CPU is
    the provider's own plus this loop's (the floor provider measures the loop)."""
    tool_specs = [tool.tool_spec]
    indices = episode_indices(len(episodes), until)

    async def play(model: Any, transcript: dict[str, Any]) -> int:
        """The episode's model calls, as Strands would make them; returns how many were made."""
        messages: list[dict[str, Any]] = [{"role": "user", "content": [{"text": transcript["prompt"]}]}]
        calls = 0
        for _ in range(len(transcript["turns"]) + 4):
            stream = model.stream(messages, tool_specs, transcript_data.SYSTEM_PROMPT, invocation_state={})
            content, stop = await assemble_message(stream)
            calls += 1
            outcome["calls_so_far"] += 1
            messages.append({"role": "assistant", "content": content})
            uses = [block["toolUse"] for block in content if "toolUse" in block]
            if stop != "tool_use" or not uses:
                break
            results = []
            for use in uses:
                output = outputs.get(use["input"].get("code"))
                if output is None:
                    outcome["errors"]["unknown code"] += 1
                    output = ""
                results.append(
                    {
                        "toolResult": {
                            "toolUseId": use["toolUseId"],
                            "status": "success",
                            "content": [{"text": output}],
                        }
                    }
                )
            messages.append({"role": "user", "content": results})
        return calls

    async def run_one(index: int) -> None:
        transcript = episodes[index % len(episodes)]
        model = provider.model(transcript)
        calls = 0
        try:
            with provider.episode_scope():
                calls = await play(model, transcript)
        except Exception as exc:
            outcome["errors"][f"{type(exc).__name__}: {str(exc)[:200]}"] += 1
        outcome["model_calls"] += calls
        if calls != len(transcript["turns"]):
            outcome["errors"][f"episode off script: {calls} calls"] += 1
        outcome["tokens"][index] = provider.trajectory_tokens(model)

    async def worker() -> None:
        for index in indices:
            await run_one(index)

    await asyncio.gather(*(worker() for _ in range(concurrency)))


async def measure(args: argparse.Namespace) -> dict[str, Any]:
    data = transcript_data.load(args.transcripts)
    episodes = [data[i % len(data)] for i in range(args.episodes)]
    misses: Counter[str] = Counter()
    tool = make_tool(transcript_data.tool_outputs(data), misses)
    provider = Provider(
        args.provider,
        args.url,
        args.max_connections,
        args.provider == "ours" and args.rollout_gc,
        args.ours_setup,
    )
    outputs = transcript_data.tool_outputs(data) if args.without_strands else None

    async def run(
        episodes: list[dict[str, Any]], concurrency: int, outcome: dict[str, Any], until: float | None = None
    ) -> None:
        if outputs is None:
            await run_episodes(provider, tool, episodes, concurrency, outcome, until)
        else:
            await run_episodes_without_strands(provider, tool, outputs, episodes, concurrency, outcome, until)

    warmup: dict[str, Any] = {"errors": Counter(), "model_calls": 0, "calls_so_far": 0, "tokens": {}}
    warm = [data[-1 - i % len(data)] for i in range(min(WARMUP_EPISODES, args.concurrency))]
    await run(warm, len(warm), warmup)
    if warmup["errors"]:
        raise RuntimeError(f"warm-up episodes failed: {dict(warmup['errors'])}")

    tick_cpu_s = await calibrate_ticker()
    gc.collect()
    rollout_gc = args.provider == "ours" and args.rollout_gc and args.ours_setup == "readme"
    if args.gc_freeze:
        gc.freeze()
    if args.gc_threshold:
        gc.set_threshold(*args.gc_threshold)
    monitor = LoadMonitor()
    baseline_rss = monitor.rss()
    gc_timer = GcTimer()
    gc.callbacks.append(gc_timer)
    outcome: dict[str, Any] = {"errors": Counter(), "model_calls": 0, "calls_so_far": 0, "tokens": {}}
    profiler = None
    if args.profile:
        import cProfile

        profiler = cProfile.Profile()
    if args.wait_for_start:
        print("ready", flush=True)
        start_at = float(await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline))
        await asyncio.sleep(max(0.0, start_at - time.time()))
    until = None if args.run_for is None else time.time() + args.run_for
    monitor.start()
    timeline: list[tuple[float, float, int, int]] = []
    sampler = asyncio.ensure_future(sample_timeline(timeline, outcome, monitor))
    cpu_start, wall_start = time.process_time(), time.perf_counter()
    times_start = os.times()
    if profiler is not None:
        profiler.enable()
    await run(episodes, args.concurrency, outcome, until)
    if profiler is not None:
        profiler.disable()
    sampler.cancel()
    timeline.append((time.time(), time.process_time(), outcome["calls_so_far"], len(monitor.lags)))
    wall = time.perf_counter() - wall_start
    cpu = time.process_time() - cpu_start
    times_end = os.times()
    await monitor.stop()
    gc.callbacks.remove(gc_timer)
    await provider.close()
    if profiler is not None:
        profiler.dump_stats(args.profile)

    calls = outcome["model_calls"]
    lags = monitor.lags
    ticker_cpu = min(cpu, tick_cpu_s * len(lags))
    provider_cpu = cpu - ticker_cpu
    return {
        "provider": args.provider,
        "strands_patches": args.strands_patches,
        "without_strands": args.without_strands,
        "rollout_gc": rollout_gc,
        "ours_setup": args.ours_setup if args.provider == "ours" else None,
        "fast_tokenizer": _fast_tokenizer_used(provider),
        "gc_freeze": args.gc_freeze,
        "gc_threshold": args.gc_threshold,
        "concurrency": args.concurrency,
        "episodes": args.episodes,
        "model_calls": calls,
        "errors": dict(outcome["errors"]),
        "tool_misses": dict(misses),
        "wall_s": wall,
        "cpu_s": provider_cpu,
        "cpu_s_with_ticker": cpu,
        "ticker_cpu_s": ticker_cpu,
        "user_s": times_end.user - times_start.user,
        "system_s": times_end.system - times_start.system,
        "cpu_ms_per_turn": provider_cpu / calls * 1e3 if calls else None,
        "turns_per_s": calls / wall if wall else None,
        "gc_s": gc_timer.seconds,
        "gc_collections": gc_timer.collections,
        "gc_s_by_generation": gc_timer.by_generation,
        "gc_collections_by_generation": gc_timer.count_by_generation,
        "loop_lag_ms": {
            "p50": _percentile(lags, 0.50) * 1e3,
            "p99": _percentile(lags, 0.99) * 1e3,
            "max": max(lags, default=0.0) * 1e3,
            "mean": statistics.fmean(lags) * 1e3 if lags else 0.0,
            "ticks": len(lags),
        },
        "rss_baseline_mb": baseline_rss / 2**20,
        "rss_peak_mb": monitor.peak_rss / 2**20,
        "rss_per_episode_kb": (monitor.peak_rss - baseline_rss) / args.concurrency / 1024,
        "trajectory_tokens": [outcome["tokens"].get(i) for i in range(args.episodes)],
        "python": sys.version.split()[0],
        "tick_cpu_s": tick_cpu_s,
        "timeline": timeline,
    }


def _fast_tokenizer_used(provider: Provider) -> bool | None:
    """Whether ours encoded with the fast-tokenizer extra (None for the others)."""
    if provider.name != "ours":
        return None
    from strands_slime.provider.chat import get_templater

    return getattr(get_templater(provider.tokenizer), "fast_encode", None) is not None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--provider", required=True, choices=PROVIDERS)
    parser.add_argument("--url", help="dev server URL (not needed for the floor)")
    parser.add_argument("--transcripts", type=Path, required=True)
    parser.add_argument("--concurrency", type=int, required=True)
    parser.add_argument("--episodes", type=int, help="episodes in the measured phase (default: concurrency)")
    parser.add_argument("--max-connections", type=int, default=1000, help="client pool size (both clients)")
    parser.add_argument("--cpu", type=int, help="pin this process to one CPU")
    parser.add_argument("--strands-patches", action="store_true", help="apply strands-notes §6 patches")
    parser.add_argument(
        "--without-strands", action="store_true", help="call the provider's stream() directly (no Agent)"
    )
    parser.add_argument(
        "--no-rollout-gc",
        dest="rollout_gc",
        action="store_false",
        help="ours: leave CPython's GC defaults (as with gc_tuning: false) instead of what generate() sets",
    )
    parser.add_argument(
        "--ours-setup",
        choices=("readme", "bare"),
        default="readme",
        help="ours: as README's 'Use the provider directly' writes it (rollout_settings() wired, the "
        "model's plugin: what generate gives its episodes) or bare Agent(model=SGLangModel(...))",
    )
    parser.add_argument(
        "--no-fast-tokenizer",
        dest="fast_tokenizer",
        action="store_false",
        help="ours: as without the fast-tokenizer extra installed (quicktok made unimportable)",
    )
    parser.add_argument("--gc-freeze", action="store_true", help="gc.freeze() after the warm-up")
    parser.add_argument(
        "--gc-threshold",
        type=lambda text: tuple(int(part) for part in text.split(",")),
        help="gc.set_threshold(A, B, C) after the warm-up, e.g. 50000,20,100",
    )
    parser.add_argument("--profile", help="write cProfile stats of the measured phase here")
    parser.add_argument(
        "--wait-for-start",
        action="store_true",
        help='after the warm-up print "ready", read a time.time() from stdin and start the measured phase then',
    )
    parser.add_argument(
        "--run-for",
        type=float,
        help="start episodes (round after round) for this many seconds instead of each one once",
    )
    parser.add_argument("--out", type=Path, required=True, help="result JSON")
    args = parser.parse_args(argv)
    args.episodes = args.episodes or args.concurrency
    if args.concurrency < 1 or args.episodes < 1:
        parser.error("--concurrency and --episodes must be >= 1")
    if args.provider != "floor" and not args.url:
        parser.error(f"--url is required for --provider {args.provider}")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    if args.cpu is not None:
        os.sched_setaffinity(0, {args.cpu})
    if args.strands_patches:
        apply_strands_patches()
    if not args.fast_tokenizer:
        sys.modules["quicktok"] = None  # type: ignore[assignment]  # an import of it raises ImportError
    result = asyncio.run(measure(args))
    args.out.write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
