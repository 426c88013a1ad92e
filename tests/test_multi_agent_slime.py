"""Several agents per episode through slime's own rollout code (commit 624b824): a solver that calls a
verifier sub-agent sharing its weights, uneven sample counts per episode, slime's reward on every
sample, GRPO normalization that counts an episode once, the dynamic-sampling filter, conversion to
training data, and the refusal under ``--partial-rollout``."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import slime_harness
from slime_harness import fresh_slime  # noqa: F401 (autouse: slime fresh around each test)

from strands_slime.config import ConfigError
from strands_slime.devserver import DevServer

pytestmark = pytest.mark.integration

VERIFIER_PROMPT = "You verify a proposed answer. Reply VERIFIED or WRONG."


def verify(text: str) -> str:
    return "<tool_call>\n" + json.dumps({"name": "verifier", "arguments": {"input": text}}) + "\n</tool_call>"


SCRIPT = [
    {"match": VERIFIER_PROMPT, "replies": ["<think>\nChecking.\n</think>\n\nVERIFIED"]},
    {"match": "ONCEQ", "replies": [verify("is 34 right?"), "Answer: \\boxed{34}"]},
    {"match": "TWICEQ", "replies": [verify("is 5 right?"), verify("sure?"), "Answer: \\boxed{5}"]},
    {"match": "NEVERQ", "replies": ["Answer: \\boxed{7}"]},
]
AGENTS = {
    "strands_slime": {
        "tools": [],
        "client": {"max_retries": 0},
        "agents": {
            "subagents": [
                {
                    "name": "verifier",
                    "description": "Checks a proposed answer.",
                    "system_prompt": VERIFIER_PROMPT,
                }
            ]
        },
    }
}
NORMALIZE = ("--custom-reward-post-process-path", "strands_slime.rollout.fanout.normalize_by_group_index")


@pytest.fixture
async def router() -> AsyncIterator[str]:
    async with (
        DevServer("scripted", script=SCRIPT) as engine,
        slime_harness.router_in_front_of(engine) as url,
    ):
        yield url


def make_args(router: str, tmp_path: Path, rows: list[tuple[str, str]], *flags: str) -> Any:
    from slime.utils.http_utils import init_http_client

    data = slime_harness.write_prompts(tmp_path / "prompts.jsonl", rows)
    args = slime_harness.slime_args(router, data, *flags, custom=AGENTS)
    init_http_client(args)
    return args


async def rollout(args: Any) -> list[list[Any]]:
    from slime.rollout.data_source import RolloutDataSourceWithBuffer
    from slime.rollout.sglang_rollout import generate_rollout_async

    output, aborted = await generate_rollout_async(args, 0, RolloutDataSourceWithBuffer(args).get_samples)
    assert aborted == []
    return output.samples


async def test_uneven_agent_samples_through_slimes_rollout_to_train_data(router: str, tmp_path: Path) -> None:
    from slime.observability.rollout_data_utils import validate_rollout_id_annotated

    args = make_args(
        router,
        tmp_path,
        [("ONCEQ: 17 times two?", "34"), ("TWICEQ: two plus three?", "5"), ("NEVERQ: two plus three?", "5")],
        "--rollout-batch-size",
        "3",
        "--n-samples-per-prompt",
        "2",
        "--dynamic-sampling-filter-path",
        "strands_slime.rollout.filters.drop_groups_with_infra_failures",
        *NORMALIZE,
    )
    groups = await rollout(args)
    validate_rollout_id_annotated(groups)
    episodes = [episode for group in groups for episode in group]
    assert all(isinstance(episode, list) for episode in episodes), "sub-agents configured: always a list"
    counts = {episode[0].prompt[0]["content"][:6]: len(episode) for episode in episodes}
    assert counts == {"ONCEQ:": 2, "TWICEQ": 3, "NEVERQ": 1}, "one sample per agent segment"
    for episode in episodes:
        assert [s.metadata["agent"] for s in episode] == ["main"] + ["verifier"] * (len(episode) - 1)
        assert len({s.rollout_id for s in episode}) == 1 and episode[0].rollout_id is not None
        assert len({json.dumps(s.reward, sort_keys=True) for s in episode}) == 1, "the episode's reward"
        for sample in episode:
            assert sample.response_length == len(sample.loss_mask) == len(sample.rollout_log_probs) >= 1
            assert sample.status.name == "COMPLETED"
    samples = [sample for episode in episodes for sample in episode]
    rewards = {s.metadata["agent"] + s.prompt[0]["content"][:6]: s.reward for s in samples}
    assert rewards["mainONCEQ:"] == rewards["verifierONCEQ:"] == 1.0 and rewards["mainNEVERQ"] < 1.0
    train = slime_harness.train_data(args, samples)
    assert len(train["tokens"]) == 12
    # every group has two identical episodes: zero advantage everywhere, whatever the sample counts
    assert train["rewards"] == pytest.approx([0.0] * 12)
    sums = dict(zip(train["rollout_ids"], train["rollout_mask_sums"], strict=True))
    twice = next(e for e in episodes if len(e) == 3)
    assert sums[twice[0].rollout_id] == sum(sum(s.loss_mask) for s in twice), "an episode is one rollout"


async def test_the_episode_counts_once_in_its_group(router: str, tmp_path: Path) -> None:
    """Two episodes of one prompt with different rewards and sample counts: each counts once."""
    from strands_slime.rollout.fanout import normalize_by_group_index

    args = make_args(
        router, tmp_path, [("ONCEQ: 17 times two?", "34")], "--n-samples-per-prompt", "2", *NORMALIZE
    )
    (group,) = await rollout(args)
    first, second = group
    for sample in first:
        sample.reward = 0.0  # as if the first episode were wrong
    second.append(second[-1])  # and the second had one more verifier sample
    samples = [*first, *second]
    _, advantages = normalize_by_group_index(args, samples)
    assert advantages[: len(first)] == pytest.approx([-0.7071] * len(first), abs=1e-3)
    assert advantages[len(first) :] == pytest.approx([0.7071] * len(second), abs=1e-3)


async def test_sub_agents_are_refused_with_partial_rollout(router: str, tmp_path: Path) -> None:
    args = make_args(router, tmp_path, [("ONCEQ: 17 times two?", "34")], "--partial-rollout")
    with pytest.raises(ConfigError, match="--partial-rollout"):
        await rollout(args)


async def test_sub_agents_without_the_episode_normalization_stop_at_the_first_episode(
    router: str, tmp_path: Path
) -> None:
    """slime's default reward post-processing reshapes by n_samples_per_prompt: with several samples per
    episode it would train on wrong advantages, so the run stops before any step, naming the flag."""
    args = make_args(router, tmp_path, [("ONCEQ: 17 times two?", "34")])
    assert args.custom_reward_post_process_path is None
    with pytest.raises(ConfigError, match="--custom-reward-post-process-path strands_slime"):
        await rollout(args)


async def test_the_verifier_recipe_runs_offline_against_the_dev_server(tmp_path: Path) -> None:
    """``configs/strands_math_verifier.yaml`` with the bundled verifier script, as its header says:
    each episode's solver sample in samples.jsonl, its verifier sample in agent_samples.jsonl."""
    from strands_slime.cli import RolloutOptions, run_rollout

    package = Path(__file__).resolve().parents[1] / "strands_slime"
    options = RolloutOptions(
        data=package / "data" / "demo_problems.jsonl",
        out=tmp_path / "out",
        script=package / "data" / "demo_verifier_script.json",
        config=package / "configs" / "strands_math_verifier.yaml",
        max_response_len=16384,
        limit=2,
        quiet=True,
    )
    await run_rollout(options)
    main = [json.loads(line) for line in (tmp_path / "out" / "samples.jsonl").read_text().splitlines()]
    subs = [json.loads(line) for line in (tmp_path / "out" / "agent_samples.jsonl").read_text().splitlines()]
    assert sorted(r["metadata"]["agent"] for r in main) == ["main", "main"]
    assert sorted(r["metadata"]["agent"] for r in subs) == ["verifier", "verifier"]
    for sub in subs:
        solver = next(r for r in main if r["group_index"] == sub["group_index"])
        assert sub["reward"] == solver["reward"] == 1.0 and sub["metadata"]["parent_agent"] == "main"
        assert sum(sub["loss_mask"]) > 0 and sub["metadata"]["tool_calls"] == solver["metadata"]["tool_calls"]


async def test_the_report_shows_an_episodes_agents_as_a_tree(tmp_path: Path) -> None:
    """``strands-slime view`` of a run with several agents: the list holds one row per episode; the
    episode's main sample and each further sample carry the tree of its agents and their segments."""
    from strands_slime.viewer import write_report

    def record(index: int, agent: str, parent: str | None, segment: int, call: str | None) -> dict[str, Any]:
        metadata = {
            "agent": agent,
            "agent_role": "main" if agent == "main" else "sub",
            "parent_agent": parent,
        }
        metadata |= {"agent_segment": segment, "parent_tool_call": call, "turns": 1, "tool_calls": 0}
        return {
            "index": index,
            "group_index": 0,
            "sample_index": 0,
            "prompt": "Q",
            "label": "4",
            "tokens": [1, 2, 3],
            "response_length": 1,
            "loss_mask": [1],
            "rollout_log_probs": [-0.5],
            "reward": 1.0,
            "status": "completed",
            "metadata": metadata,
        }

    out = tmp_path / "run"
    out.mkdir()
    (out / "samples.jsonl").write_text(json.dumps(record(0, "main", None, 0, None)) + "\n")
    further = [
        record(0, "verifier", "main", 0, "call_1"),
        record(0, "verifier", "main", 1, "call_2"),
        record(0, "checker", "verifier", 0, "call_3"),
    ]
    (out / "agent_samples.jsonl").write_text("".join(json.dumps(r) + "\n" for r in further))
    html = write_report(out).read_text()
    data = json.loads(
        html.split('<script type="application/json" id="report-data">', 1)[1].split("</script>", 1)[0]
    )
    assert len(data["rows"]) == 1 and len(data["agentRows"]) == 3, "the list holds one row per episode"
    tree = data["rows"][0]["ag"]
    assert [(n["a"], n["pa"], n["sg"], n["p"]) for n in tree] == [
        ("main", None, 0, 0),
        ("verifier", "main", 0, 1),
        ("verifier", "main", 1, 2),
        ("checker", "verifier", 0, 3),
    ]
    assert all(row["ag"] == tree for row in data["agentRows"]) and "agentTree(row, position)" in html
    from chromium import chromium, find_chromium

    executable = find_chromium()
    if executable is None:
        return  # the page's data is checked above; tests/test_viewer.py names what installs chromium
    async with chromium(executable, tmp_path / "profile") as browser:
        page = await browser.open((out / "report.html").as_uri())
        await page.wait_for("document.body.dataset.ready === '1'")
        assert await page.evaluate("document.querySelectorAll('#rows tr').length") == 1
        await page.evaluate("document.querySelector(`#rows tr[data-p='0']`).click()")
        await page.wait_for("!!document.querySelector('#detail .agents')")
        lines = await page.evaluate(
            "[...document.querySelectorAll('#detail .agent')].map(d => d.textContent)"
        )
        assert lines == [
            "main: segment 0 (shown) ",
            "└ verifier: segment 0 segment 1 ",
            "└ checker: segment 0 ",
        ]
        await page.evaluate("document.querySelector(`#detail .agents a[data-position='3']`).click()")
        await page.wait_for("document.querySelector('#detail h2').textContent.includes('checker')")
        assert (
            await page.evaluate("document.querySelector('#detail h2').textContent")
            == "sample 0 · checker segment 0"
        )
