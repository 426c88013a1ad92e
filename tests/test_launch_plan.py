"""The training launch's settings, checkpoint sizing and train.py command, called directly (no process
started). tests/test_scripts.py runs the whole plan (its dry run and refusals) and the script itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from strands_slime.launch.checkpoints import retain_interval, room_checks, save_cadence
from strands_slime.launch.inputs import EvalSettings, response_budget
from strands_slime.launch.pilot import PILOT_FORMAT
from strands_slime.launch.plan import pilot_settings, preflight_args, ray_auth_enabled, shell_assignments
from strands_slime.launch.settings import LaunchError, LaunchSettings, read_settings
from strands_slime.launch.train_command import train_command

pytestmark = pytest.mark.unit

REPO = Path(__file__).resolve().parents[1]


def _settings(tmp_path: Path | None = None, **environ: str) -> LaunchSettings:
    base = {"RUN_DIR": str(tmp_path / "run")} if tmp_path else {}
    return read_settings({**base, **environ}, repo_root=REPO)


def test_every_default_and_the_preset_fill_only_what_is_unset() -> None:
    one = _settings()
    assert (one.num_nodes, one.rollout_batch_size, one.global_batch_size, one.num_rollout) == (
        1,
        16,
        128,
        3000,
    )
    assert one.over_sampling_batch_size == 32 and one.eval_config == f"{REPO}/configs/eval_aime.yaml"
    assert one.run_dir == "/root/checkpoints/qwen3-8b-strands-slime/run" and one.node_dir.endswith(
        "/run/node0"
    )
    four = _settings(PRESET="4x8", MASTER_ADDR="10.0.0.1", NUM_ROLLOUT="100")
    assert (four.num_nodes, four.rollout_batch_size, four.global_batch_size, four.num_rollout) == (
        4,
        64,
        128,
        100,
    )
    assert four.over_sampling_batch_size == 128 and four.total_gpus == 32
    assert _settings(EVAL_CONFIG="").eval_config == "", "set but empty: eval from EVAL_DATA"
    assert _settings(ROLLOUT_BATCH_SIZE="").rollout_batch_size == 16, "empty means the default"


def test_a_wrong_setting_is_one_line_naming_it() -> None:
    for environ, message in (
        ({"KEEP_RAY": "perhaps"}, "KEEP_RAY: expected a boolean"),
        ({"NUM_ROLLOUT": "1e3"}, "NUM_ROLLOUT must be a non-negative integer, got '1e3'"),
        ({"SAVE_INTERVAL": "0"}, "SAVE_INTERVAL must be >= 1, got 0"),
        ({"ROUTER_ASSIGNMENT_MODE": "first"}, "ROUTER_ASSIGNMENT_MODE must be min_load, min_group or random"),
        ({"RAY_NODE_RESOURCES": '{"cpu": true}'}, "RAY_NODE_RESOURCES must be a JSON object"),
        ({"WANDB_API_KEY_FILE": "/nowhere/key"}, "WANDB_API_KEY_FILE is not a readable file"),
    ):
        with pytest.raises(LaunchError) as refused:
            _settings(**environ)
        assert message in str(refused.value) and "\n" not in str(refused.value)


def test_a_worker_finds_its_own_address_or_says_to_set_it() -> None:
    worker = {"NUM_NODES": "2", "NODE_RANK": "1", "MASTER_ADDR": "10.0.0.1"}
    found = read_settings(worker, repo_root=REPO, resolve_address=lambda addr, port: "10.0.0.7")
    assert found.node_ip == found.slime_host_ip == "10.0.0.7"

    def unreachable(addr: str, port: int) -> str:
        raise OSError("Network is unreachable")

    with pytest.raises(
        LaunchError, match=r"cannot tell this node's address towards MASTER_ADDR .*; set NODE_IP"
    ):
        read_settings(worker, repo_root=REPO, resolve_address=unreachable)


def test_many_nodes_without_the_preset_get_a_note() -> None:
    notes: list[str] = []
    read_settings({"NUM_NODES": "2", "MASTER_ADDR": "10.0.0.1"}, repo_root=REPO, note=notes.append)
    assert len(notes) == 1 and notes[0].startswith("note: NUM_NODES=2 keeps the one-node batch")


def test_the_cadence_comes_from_the_pilot_the_estimate_or_the_users_interval(tmp_path: Path) -> None:
    pilot_json = tmp_path / "pilot.json"
    settings = _settings(tmp_path, PILOT_JSON=str(pilot_json), STEP_MINUTES="7.5")
    wanted = pilot_settings(settings)
    estimate = save_cadence(settings, wanted)
    assert (estimate.interval, estimate.problem) == (16, None) and "an estimate" in (estimate.why or "")
    pilot_json.write_text(
        json.dumps(
            {
                "format": PILOT_FORMAT,
                "settings": wanted,
                "measured": {"per_step": {"step_seconds": {"p90": 600.0, "mean": 500.0}}},
            }
        )
    )
    measured = save_cadence(settings, wanted)
    assert measured.interval == 12 and "p90 step time of 600.0 s" in (measured.why or "")
    other = save_cadence(settings, {**wanted, "TP_SIZE": "4"})
    assert other.problem and "TP_SIZE: pilot '2', now '4'" in other.problem
    assert save_cadence(_settings(tmp_path, SAVE_INTERVAL="5000"), wanted).interval == 3000, "at most the run"
    assert save_cadence(_settings(tmp_path, PILOT="1"), wanted).interval == 4, "a pilot saves halfway"
    none = save_cadence(_settings(tmp_path, PILOT_JSON=str(tmp_path / "none.json")), wanted)
    assert none.interval == 1 and "run --pilot first" in (none.problem or "")


def test_only_the_latest_checkpoint_is_kept_for_every_interval() -> None:
    for steps, interval in ((3000, 30), (3000, 1), (8, 4), (750, 7)):
        retain = retain_interval(steps, interval)
        assert retain % interval == 0 and retain > steps
        saved = [k * interval - 1 for k in range(1, steps // interval + 1)] + [steps - 1]
        assert not any(iteration > 0 and iteration % retain == 0 for iteration in saved)


def test_room_for_the_checkpoints_kept_at_once(tmp_path: Path) -> None:
    gib = 2**30

    def disk(free_gib: int):
        return lambda path: free_gib * gib

    settings = _settings(tmp_path, CHECKPOINT_GB="100", RAY_TEMP_DIR="/tmp/r")
    problems, notes = room_checks(settings, 100, disk(150))
    assert problems == [
        f"SAVE_DIR ({settings.save_dir}) has 150 GB free, less than 200 GB (two 100 GB checkpoints at once: "
        "the next is written before the previous goes)"
    ]
    assert notes == []
    problems, _ = room_checks(
        _settings(tmp_path, CHECKPOINT_GB="100", KEEP_CHECKPOINTS="all"), 100, disk(1000)
    )
    assert "KEEP_CHECKPOINTS=all: 30 checkpoints of 100 GB" in problems[0]
    problems, notes = room_checks(settings, 100, disk(0))
    assert len(problems) == 2 and problems[1].startswith(
        f"RUN_DIR ({tmp_path}/run) has 0 GB free, less than 1 GB"
    )
    assert notes == [
        "note: RAY_TEMP_DIR (/tmp/r) has 0 GB free, less than 20 GB (Ray's session logs and object spilling)"
    ]
    _, notes = room_checks(
        _settings(tmp_path, RAY_TEMP_DIR="/tmp/" + "x" * 40, CHECKPOINT_GB="0"), 1, disk(100)
    )
    assert any("keep it under 40" in note for note in notes)


def test_the_episode_budget_is_the_last_flag_train_py_gets() -> None:
    assert response_budget(32768, []) == 32768
    assert response_budget(32768, ["--rollout-max-response-len", "1024", "--lr", "1"]) == 1024
    assert response_budget(32768, ["--rollout-max-response-len=2048", "--rollout-max-response-len", "8"]) == 8


def test_the_train_command_of_a_pilot_has_eval_off_and_its_own_folder() -> None:
    settings = _settings(PILOT="1", SAVE_DIR="/s")
    argv = train_command(settings, ["--num-layers", "36"], EvalSettings(16, 32768), 4)
    assert argv[:2] == ["python3", "/root/slime/train.py"] and "--num-layers" in argv
    assert not any(token.startswith("--eval") for token in argv)
    assert (
        argv[argv.index("--save") + 1] == "/s/pilot/checkpoint"
        and argv[argv.index("--num-rollout") + 1] == "8"
    )


def test_a_config_with_several_samples_per_episode_gets_the_episode_normalization() -> None:
    flag, normalize = (
        "--custom-reward-post-process-path",
        "strands_slime.rollout.fanout.normalize_by_group_index",
    )
    plain = train_command(_settings(), [], EvalSettings(16, 32768), 4)
    assert flag not in plain
    verifier = _settings(ROLLOUT_CONFIG=str(REPO / "configs" / "strands_math_verifier.yaml"))
    argv = train_command(verifier, [], EvalSettings(16, 32768), 4)
    assert argv[argv.index(flag) + 1] == normalize
    own = read_settings(
        {"ROLLOUT_CONFIG": verifier.rollout_config}, repo_root=REPO, extra_train_args=[f"{flag}=mine.post"]
    )
    assert argv.count(flag) == 1 and flag not in train_command(own, [], EvalSettings(16, 32768), 4)


def test_ray_token_authentication_follows_the_installed_ray() -> None:
    notes: list[str] = []
    assert ray_auth_enabled("auto", "2.52.0", notes.append) and notes == []
    assert not ray_auth_enabled("auto", "2.40.1", notes.append) and "authentication is off" in notes[0]
    assert not ray_auth_enabled("off", "2.60.0", notes.append)
    with pytest.raises(LaunchError, match=r"RAY_AUTH=on needs Ray 2\.52"):
        ray_auth_enabled("on", "", notes.append)


def test_shell_assignments_quote_every_value() -> None:
    from strands_slime.launch.plan import LaunchPlan

    settings = _settings(WANDB_API_KEY="a'b $c")
    plan = LaunchPlan(
        settings=settings,
        evaluation=EvalSettings(16, 32768),
        save_interval=1,
        ray_version="",
        ray_auth=False,
        train=["python3", "x y"],
        ray_node=["ray"],
        submit=[],
        supervisor=[],
        sampler=[],
        analyze=[],
        preflight=[],
        runtime_env={"env_vars": {}},
        proxy_bypass={},
    )
    text = shell_assignments(plan, foreground=False, detached_args=["--foreground"])
    assert "TRAIN_CMD=(python3 'x y')" in text and "export WANDB_API_KEY='a'\"'\"'b $c'" in text
    assert "RAY_VERSION=unknown" in text and "FOREGROUND=0" in text


def test_the_preflight_checks_the_sandbox_unless_accepted_and_every_shared_folder() -> None:
    real = preflight_args(_settings(SAVE_DIR="/s", RUN_DIR="/r"))
    assert real[:2] == ["--gpus", "8"] and "--router-arg=manual" in real
    assert real[real.index("--sandbox-config") + 1] == f"{REPO}/configs/strands_math.yaml"
    assert [real[i + 1] for i, token in enumerate(real) if token == "--writable"] == ["/s", "/r"]
    assert "--allow-host-network" not in real
    accepted = preflight_args(_settings(SAVE_DIR="/s", SANDBOX_HOST_NETWORK="1", PILOT="1"))
    assert "--allow-host-network" in accepted and accepted[-2:] == ["--writable", "/s/pilot"]
    dry = preflight_args(_settings(DRY_RUN="1"))
    assert "--writable" not in dry and "--sandbox-config" not in dry, "a dry run creates no folder"


def test_the_users_own_arguments_are_never_taken_for_the_scripts(capsys: pytest.CaptureFixture[str]) -> None:
    from strands_slime.launch.plan import main

    assert main(["--script", "/x/strands_qwen3_8b.sh", "--pythonpath", "", "--script", "y"], environ={}) == 1
    assert "error: unknown argument '--script'" in capsys.readouterr().err
