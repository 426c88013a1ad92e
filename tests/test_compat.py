"""What users of earlier releases wrote keeps working for one more release, and says where it moved.

Written as a user of those releases would: dotted paths handed to slime, the seed quick start's list
API of the trajectory, the old names of the trajectory."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

import strands_slime
from strands_slime.provider.trajectory import TokenArray, TokenTrajectory
from strands_slime.runtime import get_runtime

pytestmark = pytest.mark.unit

_PROVIDER = ("chat", "chat_families", "client", "client_errors", "constraints", "limits",
             "model", "template_check", "tokenizer", "tool_parsers", "trajectory")  # fmt: skip
_ROLLOUT = ("executor", "executor_worker", "fanout", "filters", "metrics", "offline", "resume",
            "slime_compat", "startup", "pacing")  # fmt: skip
MOVED: dict[str, str] = {
    **{f"strands_slime.{name}": f"strands_slime.provider.{name}" for name in _PROVIDER},
    **{f"strands_slime.{name}": f"strands_slime.rollout.{name}" for name in _ROLLOUT},
    "strands_slime.eval_metrics": "strands_slime.reward.eval_metrics",
    "strands_slime.math_answer": "strands_slime.reward.math_answer",
    "strands_slime.math_answer.judge": "strands_slime.reward.math_answer.judge",
    "strands_slime.math_answer.normalize": "strands_slime.reward.math_answer.normalize",
    "strands_slime.math_answer.verify": "strands_slime.reward.math_answer.verify",
    "strands_slime.rollout.episode_metadata": "strands_slime.episode_metadata",
    "strands_slime.deepseek_v32": "strands_slime.provider.deepseek",
    "strands_slime.provider.deepseek_v32": "strands_slime.provider.deepseek",
}
"""The module paths of earlier releases -> where they live now."""

MOVED_ATTRIBUTES: dict[str, dict[str, str]] = {
    "strands_slime.rollout": dict.fromkeys(
        (
            "generate",
            "Episode",
            "EpisodeOutcome",
            "GC_THRESHOLDS",
            "tune_gc_once",
            "get_client",
            "get_tokenizer",
            "warm_up",
            "reset_attempt",
            "prepare_resume",
            "SAMPLE_RESULT_FIELDS",
            "RESUME_FIELDS",
            "STICKY_ROUTER_POLICIES",
        ),
        "strands_slime.rollout.episode",
    ),
    "strands_slime.reward": dict.fromkeys(
        (
            "reward_func",
            "preset_reward",
            "compute_reward",
            "reward_details",
            "scoring_text",
            "shape_reward",
            "INFRA_FAILURE_REASON",
        ),
        "strands_slime.reward.dapo",
    ),
}
"""The attributes of the packages that were modules -> the module that holds each now."""

PACKAGES = {"strands_slime.math_answer"}
"""Old package paths: a package of their own (their old submodules live under them) forwarding every name."""

SLIME_DOTTED_PATHS = (
    "strands_slime.metrics.log_rollout",
    "strands_slime.metrics.log_eval_rollout",
    "strands_slime.filters.drop_infra_failures_and_zero_std",
    "strands_slime.filters.drop_groups_with_infra_failures",
    "strands_slime.fanout.normalize_by_group_index",
    "strands_slime.rollout.generate",
    "strands_slime.reward.reward_func",
)
"""What launch scripts of earlier releases passed to slime's ``--custom-*-path`` flags."""


def load_function(path: str) -> Any:
    """slime's own ``load_function``: import the module, get the attribute."""
    module_path, _, name = path.rpartition(".")
    return getattr(importlib.import_module(module_path), name)


def _forget(old: str) -> None:
    """As if this process had never imported ``old`` (the warning is once per process)."""
    sys.modules.pop(old, None)
    get_runtime().logged.discard(f"deprecated path: {old}")


@pytest.mark.parametrize("old", sorted(MOVED))
def test_every_old_module_path_is_the_new_module_and_warns_once(old: str) -> None:
    _forget(old)
    with pytest.warns(DeprecationWarning, match=rf"{old} is deprecated .* use {MOVED[old]}$"):
        module = importlib.import_module(old)
    new = importlib.import_module(MOVED[old])
    if old in PACKAGES:
        assert module.__all__ and all(getattr(module, name) is getattr(new, name) for name in new.__all__)
    else:
        assert module is new, "the same module object: no duplicated state"
    _forget(old)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        importlib.import_module(old)
        importlib.import_module(old)
    assert [str(w.message) for w in caught if issubclass(w.category, DeprecationWarning)] == [
        f"{old} is deprecated and will be removed in the next release; use {MOVED[old]}"
    ], "once per process"


@pytest.mark.parametrize("path", SLIME_DOTTED_PATHS)
def test_dotted_paths_of_earlier_launch_scripts_still_load(path: str) -> None:
    module_path = path.rpartition(".")[0]
    _forget(module_path)
    get_runtime().logged.discard(f"deprecated path: {path}")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        function = load_function(path)
    assert callable(function)
    assert any(issubclass(w.category, DeprecationWarning) for w in caught), path


@pytest.mark.parametrize(
    ("package", "name"), [(package, name) for package, names in MOVED_ATTRIBUTES.items() for name in names]
)
def test_attributes_of_modules_that_became_packages(package: str, name: str) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        value = getattr(importlib.import_module(package), name)
    home = MOVED_ATTRIBUTES[package][name]
    assert value is getattr(importlib.import_module(home), name)


def test_a_name_that_never_existed_is_still_an_attribute_error() -> None:
    import strands_slime.math_answer
    import strands_slime.rollout

    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        strands_slime.rollout.no_such_thing  # noqa: B018
    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        strands_slime.math_answer.no_such_thing  # noqa: B018


def test_an_old_package_s_submodules_are_the_new_modules() -> None:
    """Imported through the old package, a submodule is the current one, never a second copy."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import strands_slime.math_answer.verify as verify
        from strands_slime.math_answer import judge

    from strands_slime.reward import math_answer

    assert judge is math_answer.judge and verify is math_answer.verify
    assert not [name for name in sys.modules if name.startswith("strands_slime.math_answer.") and
                sys.modules[name].__name__ == name], "no module runs twice under its old name"  # fmt: skip


def test_importing_the_package_installs_nothing_in_the_import_system() -> None:
    """No finder or hook of ours: the old paths are plain modules."""
    done = subprocess.run(
        [sys.executable, "-c", "import sys; before = list(sys.meta_path), list(sys.path_hooks); "
         "import strands_slime, strands_slime.metrics; assert (list(sys.meta_path), list(sys.path_hooks)) == before"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr


def test_submodules_of_the_packages_are_not_shadowed_by_the_forwarding() -> None:
    from strands_slime.rollout import pacing, slime_compat

    assert pacing.__name__ == "strands_slime.rollout.pacing"
    assert slime_compat.__name__ == "strands_slime.rollout.slime_compat"


@pytest.mark.integration
def test_the_warning_points_at_the_user_s_import_so_a_script_shows_it(tmp_path: Path) -> None:
    script = tmp_path / "old_launcher.py"
    script.write_text("import strands_slime.metrics\nfrom strands_slime.rollout import generate\n")
    here = str(Path(strands_slime.__file__).parents[1])  # this checkout, first on the script's path
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")]))}
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert f"{script}:1: DeprecationWarning: strands_slime.metrics is deprecated" in done.stderr
    assert f"{script}:2: DeprecationWarning: strands_slime.rollout.generate is deprecated" in done.stderr


@pytest.mark.integration
def test_python_dash_m_of_an_old_package_path_runs_the_new_one() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "strands_slime.math_answer"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "usage: python -m strands_slime.reward.math_answer" in done.stderr


# ------------------------------------------------------------------ the trajectory, as the seed documented it


def test_the_trajectory_compares_with_lists_as_the_seed_quick_start_wrote_it() -> None:
    trajectory = TokenTrajectory()
    trajectory.add_prompt([151644, 872, 198])
    trajectory.add_output([9707, 151645], [-0.25, -0.5])
    assert trajectory.token_ids == [151644, 872, 198, 9707, 151645]
    assert [151644, 872, 198, 9707, 151645] == trajectory.token_ids
    assert trajectory.loss_mask == [0, 0, 0, 1, 1]
    assert trajectory.logprobs == [0.0, 0.0, 0.0, -0.25, -0.5]
    assert trajectory.token_ids != [151644]
    assert trajectory.token_ids[3:] == [9707, 151645], "slices are list-compatible too"
    assert trajectory.token_ids[-1] == 151645
    assert list(trajectory.token_ids) == trajectory.token_ids.tolist()
    assert trajectory.copy().token_ids == trajectory.token_ids and isinstance(
        trajectory.copy().logprobs, TokenArray
    )
    assert trajectory.token_ids[:2] + [1] == [151644, 872, 1] and isinstance(
        trajectory.token_ids[:], TokenArray
    )


def test_a_token_array_is_still_an_array() -> None:
    import copy
    import pickle
    from array import array

    values = TokenArray("i", [1, 2, 3])
    assert isinstance(values, array) and values.typecode == "i"
    assert values == array("i", [1, 2, 3]) and values != array("i", [1, 2])
    assert pickle.loads(pickle.dumps(values)) == [1, 2, 3]
    assert type(copy.deepcopy(values)) is TokenArray and type(copy.copy(values)) is TokenArray
    assert values != "123" and values != {1: 1}
    with pytest.raises(TypeError):
        hash(values)


def test_the_old_names_of_the_trajectory_are_the_trajectory_and_warn_once(qwen3_tokenizer: Any) -> None:
    from strands_slime.provider.model import SGLangModel

    model = SGLangModel(qwen3_tokenizer, base_url="http://127.0.0.1:9")
    for name in ("token_manager", "rollout"):
        with pytest.warns(
            DeprecationWarning, match=f"SGLangModel.{name} is deprecated; use SGLangModel.trajectory"
        ):
            assert getattr(model, name) is model.trajectory
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert getattr(model, name) is model.trajectory, "once per process"
