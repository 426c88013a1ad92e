"""The launch pilot's analyzer: what it reads from a job's log, TensorBoard files and nvidia-smi samples,
what it projects from them, what it says it could not measure, and the checkpoint interval it gives.

The last test drives slime's real logging code (its rollout and trainer ``perf`` lines, its TensorBoard
adapter, its sample hooks) with our hook and log function, and analyzes what they wrote; only
Megatron's parallel state is stubbed (it needs GPUs).
"""

from __future__ import annotations

import json
import logging
import sys
import types
from pathlib import Path

import pytest

from strands_slime.launch.pilot import (
    LOGPROB_GAP_TAG,
    Plan,
    analyze,
    main,
    parse_job_log,
    read_gpu_samples,
    read_tensorboard_scalars,
    report,
    save_interval_for,
)

pytestmark = pytest.mark.unit

RAY = "(RolloutManager pid=4242, ip=10.0.0.2) "
TRAINER = "(MegatronTrainRayActor pid=777, ip=10.0.0.2) "


def _rollout_perf(step: int, rollout_s: float) -> str:
    return (
        f"{RAY}[2026-11-26 10:{step:02d}:00] rollout_metrics.py:268 - perf {step}: "
        f"{{'rollout/dynamic_filter/drop_zero_std_-1.0': 1, 'rollout/response_len/mean': np.float64(2048.5), "
        f"'perf/rollout_time': {rollout_s}, 'perf/tokens_per_gpu_per_sec': np.float64(1234.5), "
        f"'rollout/truncated_ratio': 0.25}}"
    )


def _train_perf(step: int, wait_s: float, train_s: float, sync_s: float, save_s: float | None = None) -> str:
    save = f", 'perf/save_model_time': {save_s}" if save_s is not None else ""
    return (
        f"{TRAINER}[2026-11-26 10:{step:02d}:30] train_metric_utils.py:401 - perf {step}: "
        f"{{'perf/update_weights_time': {sync_s}, 'perf/train_wait_time': {wait_s}, "
        f"'perf/train_time': {train_s}, 'perf/step_time': {wait_s + train_s}, "
        f"'perf/wait_time_ratio': {wait_s / (wait_s + train_s)}{save}}}"
    )


def _record(step: int, **values: float) -> str:
    record = {f"rollout/strands/step/{k}": v for k, v in values.items()}
    return (
        f"{RAY}[2026-11-26 10:{step:02d}:10] metrics.py:240 - strands_slime step {step}: {json.dumps(record)}"
    )


def _job_log() -> str:
    lines = [
        "[2026-11-26 09:50:00] arguments.py:1602 - parse_args",  # the job's first slime line
        "(SGLangEngine pid=1) [2026-11-26 09:58:00 TP0] Decode batch. #running-req: 40, #token: 90000, "
        "token usage: 0.42, cuda graph: True, gen throughput (token/s): 3000.0, #queue-req: 0",
        "(SGLangEngine pid=1) [2026-11-26 09:59:00 TP0] Decode batch. #running-req: 64, #token: 190000, "
        "token usage: 0.91, cuda graph: True, gen throughput (token/s): 2500.0, #queue-req: 7",
        f"{TRAINER}[2026-11-26 10:00:40] memory_utils.py:49 - [Rank 0] Memory-Usage before update_weights: "
        "{'gpu': '0', 'total_GB': 79.1, 'free_GB': 20.0, 'used_GB': 59.1, 'allocated_GB': 50.0}",
        f"{TRAINER}[2026-11-26 10:00:41] memory_utils.py:49 - [Rank 1] Memory-Usage after update_weights "
        "(cleared before print): {'gpu': '1', 'total_GB': 79.1, 'free_GB': 9.0, 'used_GB': 70.1}",
        "some unrelated line: perf tuning is fun",
        f"{RAY}[2026-11-26 10:00:00] rollout_metrics.py:268 - perf 9: {{'perf/rollout_time': }}",
    ]
    for step, (rollout_s, wait_s, train_s, save_s) in enumerate(
        [
            (400.0, 500.0, 50.0, None),
            (300.0, 360.0, 40.0, None),
            (320.0, 380.0, 40.0, 90.0),
            (340.0, 400.0, 40.0, None),
        ]
    ):
        lines.append(_rollout_perf(step, rollout_s))
        lines.append(
            _record(
                step,
                groups_kept=16,
                groups_dropped=8,
                keep_rate=16 / 24,
                episodes=208,
                aborted=16,
                aborted_ratio=16 / 208,
                truncated_ratio=0.1,
                length_truncated=19,
                resumed=4,
                ended_tokens_per_s=5000.0 + step,
            )
        )
        lines.append(_train_perf(step, wait_s, train_s, 10.0, save_s))
    return "\n".join(lines) + "\n"


GPU_SAMPLES = [
    {
        "time": 1.0,
        "node": 0,
        "gpus": [
            {"index": 0, "used_mib": 60000.0, "total_mib": 81920.0},
            {"index": 1, "used_mib": 70000.0, "total_mib": 81920.0},
        ],
        "apps": [
            {"gpu": 0, "pid": 1, "used_mib": 58000.0, "role": "rollout"},
            {"gpu": 1, "pid": 2, "used_mib": 30000.0, "role": "rollout"},
            {"gpu": 1, "pid": 3, "used_mib": 39000.0, "role": "train"},
        ],
    },
    {"time": 3.0, "node": 0, "error": "TimeoutExpired: nvidia-smi"},
    {
        "time": 5.0,
        "node": 0,
        "gpus": [{"index": 0, "used_mib": 65000.0, "total_mib": 81920.0}],
        "apps": [{"gpu": 0, "pid": 9, "used_mib": 64000.0, "role": "unknown"}],
    },
]


def test_the_job_log_gives_every_step_merged_from_its_three_sources() -> None:
    log = parse_job_log(_job_log())
    assert sorted(log.steps) == [0, 1, 2, 3] and log.records == {0, 1, 2, 3}
    step = log.steps[2]
    assert step["perf/rollout_time"] == 320.0 and step["perf/step_time"] == 420.0
    assert step["perf/save_model_time"] == 90.0
    assert step["perf/tokens_per_gpu_per_sec"] == 1234.5, "numpy scalars read as their value"
    assert step["rollout/strands/step/keep_rate"] == pytest.approx(2 / 3)
    assert log.kv_token_usage == [0.42, 0.91] and log.queued_requests == [0, 7]
    assert log.memory_used_gb == {0: 59.1, 1: 70.1}
    assert log.unparsed == 1, "the broken perf line is counted, not fatal"
    assert log.first_time is not None and log.step_times[0].minute == 0


def test_analyze_measures_the_steps_after_the_first_and_projects_the_run() -> None:
    log = parse_job_log(_job_log())
    plan = Plan(num_rollout=3000, gpus=8, checkpoint_gb=115.0, gpu_hour_price=2.5, settings={"TP_SIZE": "2"})
    pilot = analyze(
        log,
        plan,
        logprob_gap=[(0, 0.02), (1, 0.03), (2, 0.04)],
        gpu_samples=GPU_SAMPLES,
        checkpoint_bytes=int(114.5e9),
    )
    measured = pilot["measured"]
    assert measured["warm_up_steps_excluded"] == [0]
    step = measured["per_step"]["step_seconds"]
    # the save (90 s, in step 2's wait) is left out of the step time: the projection counts it once
    assert (step["mean"], step["p50"], step["p90"], step["n"]) == (390.0, 400.0, 440.0, 3.0)
    split = measured["step_split_mean_seconds"]
    assert split == {
        "rollout_seconds": 320.0,
        "train_seconds": 40.0,
        "weight_sync_seconds": 10.0,
        "other_seconds": 20.0,
    }
    assert measured["per_step"]["keep_rate"]["mean"] == pytest.approx(2 / 3)
    assert measured["per_step"]["aborted_ratio"]["mean"] == pytest.approx(16 / 208)
    assert measured["logprob_gap"]["mean"] == pytest.approx(0.03)
    memory = measured["gpu_memory"]
    assert memory["peak_used_gib"] == pytest.approx(70000 / 1024)
    assert memory["min_headroom_gib"] == pytest.approx((81920 - 70000) / 1024)
    assert memory["peak_by_role_gib"] == {
        "rollout": pytest.approx(58000 / 1024),
        "train": pytest.approx(39000 / 1024),
        "unknown": pytest.approx(64000 / 1024),
    }
    assert measured["kv_cache_token_usage"]["max"] == 0.91
    assert measured["trainer_memory_used_gb_max"] == 70.1
    assert measured["checkpoint_gb"] == pytest.approx(114.5)
    assert measured["startup_seconds"] == pytest.approx(10 * 60 + 10 - 400.0)

    projection = pilot["projection"]
    assert projection["save_interval"] == save_interval_for(440.0, 2.0) == 16  # 7,200 s / 440 s
    saves = -(-3000 // 16)
    hours = (3000 * 390.0 + saves * 90.0 + 210.0) / 3600
    assert projection["wall_clock_hours"] == pytest.approx(hours)
    assert projection["gpu_hours"] == pytest.approx(hours * 8)
    assert projection["cost"] == pytest.approx(hours * 8 * 2.5)
    assert projection["disk"]["checkpoints_kept"] == 2
    assert projection["disk"]["checkpoints_gb"] == pytest.approx(229.0)
    assert pilot["settings"] == {"TP_SIZE": "2"}
    assert set(pilot["missing"]) == {"gpu_memory_by_role", "longest_response"}, pilot["missing"]
    text = report(pilot)
    assert "390.0 s" in text and "GPU-hours" in text and "gpu_memory_by_role" in text


def test_the_record_lines_of_our_log_function_are_read_back_as_ray_forwards_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from types import SimpleNamespace

    from strands_slime.rollout.metrics import STEP_RECORD_PREFIX, count_episode, log_rollout
    from strands_slime.rollout.slime_compat import Sample

    caplog.set_level(logging.INFO, logger="strands_slime.rollout.metrics")
    args = SimpleNamespace(n_samples_per_prompt=2)
    kept = []
    for index, status in enumerate(["completed", "truncated", "aborted"]):
        sample = Sample(group_index=0 if index < 2 else 1, response_length=100)
        sample.status = Sample.Status(status)
        count_episode(args, sample, rollout_id=3)
        if index < 2:
            kept.append(sample)
    log_rollout(3, args, kept, {"rollout/dynamic_filter/drop_zero_std_1.0": 1}, 10.0)
    (line,) = [r.getMessage() for r in caplog.records if r.getMessage().startswith(STEP_RECORD_PREFIX)]
    job_log = f"{RAY}[2026-11-26 10:00:00] metrics.py:250 - {line}\n"
    record = parse_job_log(job_log).steps[3]
    assert record["rollout/strands/step/aborted"] == 1.0 and record["rollout/strands/step/keep_rate"] == 0.5


def test_what_was_not_measured_is_named_with_the_reason_never_filled_in() -> None:
    log = parse_job_log(_rollout_perf(0, 10.0) + "\n")
    pilot = analyze(log, Plan(num_rollout=10, gpus=8), logprob_gap_missing="no tensorboard here")
    missing = pilot["missing"]
    assert "strands_slime.rollout.metrics.log_rollout" in missing["episode_counts"]
    assert "perf/step_time" in missing["step_seconds"]
    assert missing["logprob_gap"] == "no tensorboard here"
    assert {"gpu_memory", "kv_cache_usage", "checkpoint_size"} <= missing.keys()
    assert pilot["projection"] == {"complete": False, "why": "no measured step time"}
    assert "not possible" in report(pilot)
    nothing = analyze(parse_job_log(""), Plan(num_rollout=10, gpus=8))
    assert "did the job reach step 0" in nothing["missing"]["steps"]


def test_keep_every_checkpoint_projects_every_save() -> None:
    pilot = analyze(
        parse_job_log(_job_log()),
        Plan(num_rollout=160, gpus=8, retain="all", save_interval=40, checkpoint_gb=100),
    )
    assert pilot["projection"]["saves"] == 4 and pilot["projection"]["disk"]["checkpoints_gb"] == 400


def test_save_interval_for_hours_at_risk() -> None:
    assert save_interval_for(600.0, 2.0) == 12
    assert save_interval_for(9000.0, 2.0) == 1, "never below one step"
    assert save_interval_for(60.0, 2.0, num_rollout=50) == 50, "never past the run"


def _write_pilot(tmp_path: Path, *setting: str) -> Path:
    log = tmp_path / "job.log"
    log.write_text(_job_log())
    out = tmp_path / "pilot"
    argv = ["analyze", "--log", str(log), "--out", str(out), "--num-rollout", "3000", "--gpus", "8"]
    for pair in setting:
        argv += ["--setting", pair]
    assert main(argv) == 0
    return out / "pilot.json"


def test_the_command_line_writes_pilot_json_and_reads_the_interval_back(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pilot_json = _write_pilot(tmp_path, "TP_SIZE=2", "NUM_NODES=1")
    assert (pilot_json.parent / "pilot.md").read_text().startswith("# Pilot report")
    capsys.readouterr()
    assert main(["save-interval", str(pilot_json), "--hours", "1", "--setting", "TP_SIZE=2"]) == 0
    assert capsys.readouterr().out.split() == ["8", "440.0"]
    # a pilot measured under other settings does not size this run
    assert main(["save-interval", str(pilot_json), "--hours", "1", "--setting", "NUM_NODES=4"]) == 2
    assert "NUM_NODES: pilot '1', now '4'" in capsys.readouterr().err
    (tmp_path / "bad.json").write_text("{}")
    assert main(["save-interval", str(tmp_path / "bad.json"), "--hours", "1"]) == 1


def test_gpu_sample_files_skip_what_cannot_be_read(tmp_path: Path) -> None:
    path = tmp_path / "gpu-node0.jsonl"
    path.write_text(json.dumps(GPU_SAMPLES[0]) + "\nnot json\n" + json.dumps(GPU_SAMPLES[1]) + "\n")
    assert read_gpu_samples([path, tmp_path / "missing.jsonl"]) == [GPU_SAMPLES[0]]


def test_tensorboard_scalars_from_several_event_files(tmp_path: Path) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.compat.proto.event_pb2 import Event
    from tensorboard.compat.proto.summary_pb2 import Summary
    from tensorboard.summary.writer.event_file_writer import EventFileWriter

    for process, values in enumerate([[(0, 0.01), (1, 0.02)], [(2, 0.03)]]):
        writer = EventFileWriter(str(tmp_path / f"process{process}"))
        for step, value in values:
            summary = Summary(value=[Summary.Value(tag=LOGPROB_GAP_TAG, simple_value=value)])
            writer.add_event(Event(step=step, wall_time=1.0, summary=summary))
        writer.close()
    found = read_tensorboard_scalars(tmp_path, [LOGPROB_GAP_TAG, "train/absent"])
    assert [step for step, _ in found[LOGPROB_GAP_TAG]] == [0, 1, 2]
    assert found[LOGPROB_GAP_TAG][2][1] == pytest.approx(0.03) and found["train/absent"] == []


# ----------------------------------------------------------------------------- slime's real logging code


@pytest.mark.slow
async def test_the_pilot_reads_what_slimes_own_logging_writes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("tensorboard")
    sys.path.insert(0, str(Path(__file__).parent))
    import slime_harness

    slime_harness.load_slime()
    mpu = types.SimpleNamespace(
        get_tensor_model_parallel_rank=lambda: 0,
        is_pipeline_last_stage=lambda: True,
        get_data_parallel_rank=lambda **_: 0,
    )
    monkeypatch.setitem(sys.modules, "megatron", types.ModuleType("megatron"))
    monkeypatch.setitem(sys.modules, "megatron.core", types.SimpleNamespace(mpu=mpu))
    monkeypatch.setenv("TENSORBOARD_DIR", str(tmp_path / "tensorboard"))
    from slime.observability import logging_utils, rollout_metrics, train_metric_utils
    from slime.observability.tensorboard_utils import _TensorboardAdapter
    from slime.observability.timer import Timer
    from slime.rollout.sample_hooks import apply_rollout_sample_hooks
    from slime.utils.misc import SingletonMeta
    from slime.utils.types import Sample

    prompts = tmp_path / "prompts.jsonl"
    slime_harness.write_prompts(prompts, [("x", "1")])
    args = slime_harness.slime_args(
        "http://127.0.0.1:9",
        prompts,
        "--use-tensorboard",
        "--n-samples-per-prompt",
        "2",
        "--rollout-batch-size",
        "2",
        "--rollout-sample-hook-path",
        "strands_slime.rollout.metrics.count_episode",
        "--custom-rollout-log-function-path",
        "strands_slime.rollout.metrics.log_rollout",
    )
    job_log = tmp_path / "job.log"
    handler = logging.FileHandler(job_log)
    handler.setFormatter(logging.Formatter(f"{RAY}[%(asctime)s] %(filename)s:%(lineno)d - %(message)s"))
    root = logging.getLogger()
    monkeypatch.setattr(root, "level", logging.INFO)
    root.addHandler(handler)
    timer = Timer()
    try:
        for step in range(4):
            kept = []
            for group in range(3):  # group 2 is dropped by the filter, one episode of group 3 aborted
                for index in range(2):
                    sample = Sample(
                        group_index=group,
                        index=2 * group + index,
                        prompt="x",
                        response="Answer: 1",
                        response_length=100 * (index + 1),
                        tokens=[1] * (1 + 100 * (index + 1)),
                        reward=float(index),
                        status=Sample.Status.COMPLETED,
                    )
                    sample = await apply_rollout_sample_hooks(args, sample, rollout_id=step)
                    if group < 2:
                        kept.append(sample)
            aborted = Sample(group_index=3, index=6, prompt="x", status=Sample.Status.ABORTED)
            await apply_rollout_sample_hooks(args, aborted, rollout_id=step)
            rollout_metrics.log_rollout_data(
                step, args, kept, {"rollout/dynamic_filter/drop_zero_std_0.0": 1}, 50.0 + step
            )
            timer.add("train_wait", 60.0 + 10 * step)
            timer.add("train", 30.0)
            timer.add("update_weights", 5.0)
            train_metric_utils.log_perf_data(step, args)
            logging_utils.log(
                args, {LOGPROB_GAP_TAG: 0.01 * (step + 1), "train/step": step}, step_key="train/step"
            )
        _TensorboardAdapter(args).finish()
    finally:
        root.removeHandler(handler)
        handler.close()
        SingletonMeta._instances.pop(_TensorboardAdapter, None)
        SingletonMeta._instances.pop(Timer, None)

    out = tmp_path / "pilot"
    argv = [
        "analyze",
        "--log",
        str(job_log),
        "--out",
        str(out),
        "--tensorboard",
        str(tmp_path / "tensorboard"),
    ]
    assert main([*argv, "--num-rollout", "100", "--gpus", "8", "--save-interval", "10"]) == 0
    pilot = json.loads((out / "pilot.json").read_text())
    measured = pilot["measured"]
    assert measured["steps_seen"] == [0, 1, 2, 3]
    per_step = measured["per_step"]
    assert per_step["step_seconds"]["mean"] == pytest.approx(110.0)  # (70 + 80 + 90) + 30 each
    assert measured["step_split_mean_seconds"]["rollout_seconds"] == pytest.approx(52.0)
    assert measured["step_split_mean_seconds"]["weight_sync_seconds"] == pytest.approx(5.0)
    assert per_step["keep_rate"]["mean"] == pytest.approx(2 / 3)
    assert per_step["aborted_ratio"]["mean"] == pytest.approx(1 / 7)
    assert per_step["tokens_per_gpu_per_s"]["mean"] == pytest.approx(
        (600 / 51 + 600 / 52 + 600 / 53) / 3
    )  # kept groups only
    assert measured["logprob_gap"]["mean"] == pytest.approx(0.025)
    assert pilot["projection"]["wall_clock_hours"] == pytest.approx(
        100 * 110.0 / 3600 + (measured["startup_seconds"] or 0) / 3600
    )


def test_the_projection_adds_evaluation_sizes_the_run_to_hours_and_says_go_or_no_go() -> None:
    log = parse_job_log(_job_log())
    plan = Plan(
        num_rollout=3000,
        gpus=8,
        save_interval=16,
        checkpoint_gb=115.0,
        eval_interval=20,
        eval_prompts=30,
        eval_samples_per_prompt=16,
        eval_max_response_len=16384,
        max_tokens_per_gpu=18432,
        run_hours=24.0,
        settings={"EXTRA_TRAIN_ARGS": "--lr 2e-6"},
    )
    pilot = analyze(log, plan, logprob_gap=[(1, 0.08)], gpu_samples=GPU_SAMPLES, checkpoint_bytes=int(115e9))
    projection = pilot["projection"]
    # 151 evaluations (before step 0, then every 20 steps) of 480 episodes; no response length was
    # measured in this log, so the estimate is named as missing, never filled in
    assert projection["evaluations"] == 151 and projection["eval_seconds_each"] is None
    assert "not estimated" in projection["eval_estimate"] and "evaluation" in projection["excluded"]
    per_rollout = 390.0 + 90.0 / 16
    assert projection["num_rollout_for_run_hours"] == int((24 * 3600 - 210.0) // per_rollout)
    verdicts = {check["check"]: check["verdict"] for check in pilot["checks"]}
    assert verdicts["logprob gap |Megatron - SGLang|, mean"] == "FAIL"
    assert verdicts["least GPU memory headroom (GiB)"] == "PASS"
    assert verdicts["longest trained episode (tokens) within MAX_TOKENS_PER_GPU"] == "UNKNOWN"
    text = report(pilot)
    assert "## Go / no-go: NO-GO" in text and "- FAIL: logprob gap" in text
    assert "EXTRA_TRAIN_ARGS=--lr 2e-6" in text and "NUM_ROLLOUT that fits 24 h" in text


def test_evaluation_time_is_estimated_from_the_pilots_throughput_and_the_longest_episode_is_reported() -> (
    None
):
    text = _job_log().replace('"ended_tokens_per_s"', '"response_length/mean": 8000.0, "ended_tokens_per_s"')
    lines = []
    for line in text.splitlines():
        if "strands_slime step" in line:
            head, _, body = line.partition("strands_slime step ")
            step, _, record = body.partition(": ")
            values = json.loads(record)
            values["rollout/strands/response_length/mean"] = 8000.0
            values["rollout/strands/response_length/max"] = 20000.0 + int(step)
            line = f"{head}strands_slime step {step}: {json.dumps(values)}"
        lines.append(line)
    log = parse_job_log("\n".join(lines) + "\n")
    plan = Plan(
        num_rollout=100,
        gpus=8,
        save_interval=50,
        eval_interval=20,
        eval_prompts=30,
        eval_samples_per_prompt=16,
        eval_max_response_len=16384,
        max_tokens_per_gpu=18432,
    )
    pilot = analyze(log, plan, gpu_samples=GPU_SAMPLES, checkpoint_bytes=int(115e9))
    projection = pilot["projection"]
    rate = (5001.0 + 5002.0 + 5003.0) / 3
    assert projection["eval_seconds_each"] == pytest.approx(480 * 8000.0 / rate)
    assert projection["evaluations"] == 6 and 0 < projection["eval_fraction"] < 1
    assert pilot["measured"]["longest_response_tokens"] == 20003.0, "every step counts, the first too"
    verdicts = {check["check"]: check["verdict"] for check in pilot["checks"]}
    assert verdicts["longest trained episode (tokens) within MAX_TOKENS_PER_GPU"] == "FAIL"
