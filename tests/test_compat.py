"""What users of earlier releases wrote keeps working for one more release, and says where it moved.

Written as a user of those releases would: dotted paths handed to slime, the seed quick start's list
API of the trajectory, the old names of the trajectory."""

from __future__ import annotations

import importlib
import subprocess
import sys
import warnings
from typing import Any

import pytest

from strands_slime._compat import MOVED, MOVED_ATTRIBUTES
from strands_slime.provider.trajectory import TokenArray, TokenTrajectory
from strands_slime.runtime import get_runtime

pytestmark = pytest.mark.unit

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
    assert module is importlib.import_module(MOVED[old]), "the same module object: no duplicated state"
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
    import strands_slime.rollout

    with pytest.raises(AttributeError, match="has no attribute 'no_such_thing'"):
        strands_slime.rollout.no_such_thing  # noqa: B018


def test_submodules_of_the_packages_are_not_shadowed_by_the_forwarding() -> None:
    from strands_slime.rollout import pacing, slime_compat

    assert pacing.__name__ == "strands_slime.rollout.pacing"
    assert slime_compat.__name__ == "strands_slime.rollout.slime_compat"


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
