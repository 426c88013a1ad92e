"""The package's layers, enforced: no module imports against the documented direction.

Data flows Agent -> ``provider/`` -> ``rollout/`` -> ``reward/``; in imports, a layer may use the layers
below it and never one above it, and the packages of one layer never import each other. Imports inside
functions and under ``TYPE_CHECKING`` count (grimp reads them statically): a lazy import is still a
dependency. The same list is in the README ("Layers").
"""

from __future__ import annotations

import pytest

grimp = pytest.importorskip("grimp", reason="grimp (a [dev] dependency) builds the import graph")

pytestmark = pytest.mark.unit

PACKAGE = "strands_slime"

DEPRECATED_PATHS = (
    "chat", "chat_families", "client", "client_errors", "constraints", "deepseek_v32", "eval_metrics",
    "executor", "executor_worker", "fanout", "filters", "limits", "math_answer", "metrics", "model",
    "offline", "pacing", "resume", "slime_compat", "startup", "template_check", "tokenizer",
    "tool_parsers", "trajectory",
)  # fmt: skip
"""Module paths of earlier releases (``strands_slime/<name>.py``, see ``_compat``): above everything."""

LAYERS = (
    grimp.Layer(*DEPRECATED_PATHS),
    grimp.Layer("cli"),
    grimp.Layer("viewer", "drift", "data_prep", "launch", "wandb_log"),
    grimp.Layer("rollout"),
    grimp.Layer("reward", "devserver"),
    grimp.Layer("config"),
    grimp.Layer("provider", "sandbox"),
    grimp.Layer("aborts", "errors", "episode_metadata", "_compat", "ray_actors", "usage"),
    grimp.Layer("runtime"),
)
"""Top to bottom; the modules named in one layer are independent of each other."""


def _illegal(graph) -> list[str]:
    found = graph.find_illegal_dependencies_for_layers(layers=LAYERS, containers={PACKAGE})
    lines = []
    for dependency in sorted(found, key=lambda d: (d.importer, d.imported)):
        for route in dependency.routes:
            chain = " -> ".join([*route.heads, *route.middle, *route.tails])
            lines.append(f"{dependency.importer} imports {dependency.imported}: {chain}")
    return lines


@pytest.fixture(scope="module")
def import_graph():
    return grimp.build_graph(PACKAGE, cache_dir=None)


def test_every_top_level_module_has_a_layer(import_graph) -> None:
    named = {tail for layer in LAYERS for tail in layer.module_tails}
    top_level = {module.split(".")[1] for module in import_graph.modules if module.count(".") >= 1} - {
        "__main__"
    }
    assert top_level <= named, f"modules without a layer: {sorted(top_level - named)}"


def test_no_import_goes_against_the_layers(import_graph) -> None:
    illegal = _illegal(import_graph)
    assert not illegal, "imports against the layers:\n" + "\n".join(illegal)


def test_the_provider_imports_nothing_of_the_rollout_the_reward_or_pacing(import_graph) -> None:
    for imported in ("strands_slime.rollout", "strands_slime.reward", "strands_slime.rollout.pacing"):
        assert not import_graph.chain_exists(
            importer="strands_slime.provider", imported=imported, as_packages=True
        ), imported


def test_the_contract_catches_an_upward_import() -> None:
    """The check is not vacuous: a provider module importing the rollout is reported."""
    graph = grimp.ImportGraph()
    for module in ("strands_slime", "strands_slime.provider", "strands_slime.provider.model"):
        graph.add_module(module)
    for module in ("strands_slime.rollout", "strands_slime.rollout.pacing", "strands_slime.sandbox"):
        graph.add_module(module)
    graph.add_import(importer="strands_slime.provider.model", imported="strands_slime.rollout.pacing")
    graph.add_import(importer="strands_slime.provider.model", imported="strands_slime.sandbox")
    illegal = _illegal(graph)
    assert any("strands_slime.provider.model -> strands_slime.rollout.pacing" in line for line in illegal)
    assert any("strands_slime.provider.model -> strands_slime.sandbox" in line for line in illegal), (
        "siblings of one layer are independent"
    )
