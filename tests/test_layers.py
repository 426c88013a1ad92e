"""The package's layers, enforced: no module imports against the documented direction.

Data flows Agent -> ``provider/`` -> ``rollout/`` -> ``reward/``; in imports, a layer may use the layers
below it and never one above it, and the packages of one layer never import each other. Imports inside
functions and under ``TYPE_CHECKING`` count (grimp reads them statically): a lazy import is still a
dependency. So do the imports grimp cannot see, added to its graph by :func:`dynamic_imports`: a module
named by a string (``importlib.import_module``, ``__import__``, ``runpy.run_module``, under any name,
and the package's own functions that hand a parameter to one of them) and a name taken from a
package's lazy exports (``from strands_slime import SGLangModel`` imports ``provider.model``). The same
list is in the README ("Layers").
"""

from __future__ import annotations

import ast
import importlib.util
from dataclasses import dataclass
from pathlib import Path

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

IMPORTERS_BY_NAME = {"importlib.import_module": 0, "importlib.__import__": 0, "__import__": 0,
                     "builtins.__import__": 0, "runpy.run_module": 0, "pkgutil.resolve_name": 0}  # fmt: skip
"""Functions that import the module their argument names (at that position)."""

NAMES_FROM_DATA = {
    ("strands_slime.config", "import_function"): "the functions a rollout or eval config names (user code)",
    ("strands_slime.sandbox._zygote", "_preload"): "the modules a sandbox config preloads (numpy, sympy)",
    ("strands_slime.sandbox._zygote", "_set_up_paths"): "WORKER_MODULES: standard-library modules",
    (
        "strands_slime.devserver.moved",
        "moved",
    ): "MOVED: the repository's benchmarks/ modules, not the package's",
}
"""Imports whose module name comes from data, never a name of this package: (module, function) -> why."""


@dataclass(frozen=True)
class DynamicImport:
    """An import grimp does not see: ``importer`` imports ``imported`` at ``line``, ``how``."""

    importer: str
    imported: str
    line: int
    how: str


@dataclass
class _Module:
    name: str
    tree: ast.Module
    is_package: bool
    aliases: dict[str, str]
    """Local name -> the dotted name it is bound to (``import importlib as il``: ``il`` -> ``importlib``)."""
    constants: dict[str, str]
    """Module-level ``NAME = "..."``."""
    lazy: dict[str, str]
    """A lazy export -> the module it lives in (module-level dicts of a module with ``__getattr__``)."""


def _modules(root: Path, package: str) -> dict[str, _Module]:
    modules = {}
    for path in sorted(root.rglob("*.py")):
        parts = [package, *path.relative_to(root).with_suffix("").parts]
        is_package = parts[-1] == "__init__"
        name = ".".join(parts[:-1] if is_package else parts)
        tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
        modules[name] = _Module(name, tree, is_package, {}, {}, {})
    for module in modules.values():
        _read_module(module, package)
    return modules


def _absolute(module: _Module, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    base = module.name.split(".")
    base = base if module.is_package else base[:-1]
    base = base[: len(base) - node.level + 1]
    return ".".join([*base, *([node.module] if node.module else [])])


def _read_module(module: _Module, package: str) -> None:
    for node in ast.walk(module.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                local = alias.asname or alias.name.split(".")[0]
                module.aliases[local] = alias.name if alias.asname else local
        elif isinstance(node, ast.ImportFrom):
            source = _absolute(module, node)
            for alias in node.names:
                module.aliases[alias.asname or alias.name] = f"{source}.{alias.name}"
    for node in module.tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            module.aliases.setdefault(node.name, f"{module.name}.{node.name}")
    has_getattr = any(isinstance(n, ast.FunctionDef) and n.name == "__getattr__" for n in module.tree.body)
    for node in module.tree.body:
        target, value = None, None
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        elif isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        if not isinstance(target, ast.Name) or value is None:
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            module.constants[target.id] = value.value
        elif isinstance(value, ast.Dict) and has_getattr:
            for key, item in zip(value.keys, value.values, strict=True):
                first = item.elts[0] if isinstance(item, ast.Tuple | ast.List) and item.elts else item
                if (
                    isinstance(key, ast.Constant)
                    and isinstance(first, ast.Constant)
                    and isinstance(first.value, str)
                    and first.value.startswith(f"{package}.")
                ):
                    module.lazy[key.value] = first.value


def _dotted(node: ast.expr, aliases: dict[str, str]) -> str | None:
    """The dotted name an expression stands for, its first part resolved through the imports."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return ".".join([aliases.get(node.id, node.id), *reversed(parts)])


def _enclosing_functions(tree: ast.Module) -> dict[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef | None]:
    owner: dict[ast.AST, ast.FunctionDef | ast.AsyncFunctionDef | None] = {}

    def visit(node: ast.AST, function: ast.FunctionDef | ast.AsyncFunctionDef | None) -> None:
        for child in ast.iter_child_nodes(node):
            owner[child] = function
            visit(child, child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else function)

    visit(tree, None)
    return owner


def dynamic_imports(root: Path, package: str) -> tuple[list[DynamicImport], list[tuple[str, str, int]]]:
    """The imports of the package under ``root`` that grimp cannot see, and the calls that import a
    module whose name is computed (``(module, function, line)``: each must be in :data:`NAMES_FROM_DATA`)."""
    modules = _modules(root, package)
    importers = dict(IMPORTERS_BY_NAME)
    found: set[DynamicImport] = set()
    computed: set[tuple[str, str, int]] = set()
    changed = True
    while changed:  # a function that imports its parameter is an importer by name too: to a fixpoint
        changed = False
        for module in modules.values():
            owner = _enclosing_functions(module.tree)
            for node in ast.walk(module.tree):
                if not isinstance(node, ast.Call):
                    continue
                name = _dotted(node.func, module.aliases)
                if name not in importers:
                    continue
                position = importers[name]
                argument = node.args[position] if len(node.args) > position else None
                function = owner.get(node)
                how = f"{name}()"
                if isinstance(argument, ast.Constant) and isinstance(argument.value, str):
                    found.add(DynamicImport(module.name, argument.value, node.lineno, how))
                elif isinstance(argument, ast.Name) and argument.id in module.constants:
                    found.add(DynamicImport(module.name, module.constants[argument.id], node.lineno, how))
                elif (
                    isinstance(argument, ast.Name)
                    and function is not None
                    and argument.id in (params := [a.arg for a in function.args.args])
                ):
                    wrapper = f"{module.name}.{function.name}"
                    if importers.get(wrapper) != params.index(argument.id):
                        importers[wrapper] = params.index(argument.id)
                        changed = True
                elif function is None or function.name != "__getattr__" or not module.lazy:
                    # (a package's lazy export is imported where it is used: below)
                    computed.add((module.name, function.name if function else "<module>", node.lineno))
    lazy = {f"{m.name}.{export}": target for m in modules.values() for export, target in m.lazy.items()}
    for module in modules.values():
        for node in ast.walk(module.tree):
            names = []
            if isinstance(node, ast.ImportFrom):
                source = _absolute(module, node)
                names = [f"{source}.{alias.name}" for alias in node.names]
            elif isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load):
                names = [_dotted(node, module.aliases) or ""]
            for dotted in names:
                target = lazy.get(dotted)
                if target is not None and not target.startswith(f"{module.name}."):
                    how = f"lazy export {dotted}"
                    found.add(DynamicImport(module.name, target, node.lineno, how))
    return sorted(found, key=lambda d: (d.importer, d.imported, d.line)), sorted(computed)


def package_root(package: str = PACKAGE) -> Path:
    """The directory of the package the tests import (this checkout's)."""
    spec = importlib.util.find_spec(package)
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations)))


def with_dynamic_imports(graph, root: Path, package: str = PACKAGE):
    """``graph`` with the imports :func:`dynamic_imports` finds under ``root`` added."""
    for found in dynamic_imports(root, package)[0]:
        graph.add_import(
            importer=found.importer, imported=found.imported, line_number=found.line, line_contents=found.how
        )
    return graph


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
    return with_dynamic_imports(grimp.build_graph(PACKAGE, cache_dir=None), package_root())


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


def test_every_module_imported_by_a_computed_name_is_known_to_come_from_data() -> None:
    """A module name built at run time could name any module of the package: each such import is
    listed with why it never does, and the list cannot go stale."""
    computed = {(module, function) for module, function, _ in dynamic_imports(package_root(), PACKAGE)[1]}
    assert computed <= set(NAMES_FROM_DATA), (
        f"imports of computed names: {sorted(computed - set(NAMES_FROM_DATA))}"
    )
    assert set(NAMES_FROM_DATA) <= computed, f"stale entries: {sorted(set(NAMES_FROM_DATA) - computed)}"


def test_the_package_s_own_dynamic_imports_are_in_the_graph(import_graph) -> None:
    """The scan reads this package: its lazy exports and its imports by name are edges of the graph."""
    for importer, imported in (
        ("strands_slime.rollout.executor_ray", "strands_slime.rollout.executor_worker"),  # by name
        ("strands_slime.rollout.startup", "strands_slime.sandbox.core"),  # through the sandbox's exports
        ("strands_slime.metrics", "strands_slime.rollout.metrics"),  # a deprecated path
    ):
        assert import_graph.direct_import_exists(importer=importer, imported=imported), (importer, imported)


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


BAD_PACKAGE = {
    "__init__.py": """
        _LAZY = {"generate": ("strands_slime.rollout.episode", "generate")}

        def __getattr__(name):
            import importlib

            module_name, attr = _LAZY[name]
            return getattr(importlib.import_module(module_name), attr)
        """,
    "_compat.py": """
        import importlib

        def load(name, target):
            return importlib.import_module(target)
        """,
    "rollout/__init__.py": "",
    "rollout/episode.py": "",
    "rollout/pacing.py": "",
    "reward/__init__.py": "",
    "provider/__init__.py": "",
    "provider/model.py": 'import importlib\nimportlib.import_module("strands_slime.rollout.pacing")\n',
    "provider/chat.py": 'from importlib import import_module as load\nload("strands_slime.reward")\n',
    "provider/client.py": 'def f():\n    __import__("strands_slime.rollout")\n',
    "provider/tokenizer.py": "from strands_slime import generate\n",
    "provider/limits.py": "import strands_slime\n\nstrands_slime.generate\n",
    "provider/trajectory.py": 'from strands_slime._compat import load\nload(__name__, "strands_slime.rollout")\n',
    "provider/constraints.py": 'import runpy\nMAIN = "strands_slime.reward"\nrunpy.run_module(MAIN)\n',
    "provider/telemetry.py": 'import importlib\ndef f(x):\n    importlib.import_module(x + "y")\n',
}


def test_every_kind_of_dynamic_import_is_caught(tmp_path: Path) -> None:
    """Not vacuous: a provider that imports the rollout or the reward by name, through an alias, a
    wrapper, a constant or the root's lazy exports is reported; a computed name is listed."""
    import textwrap

    for relative, source in BAD_PACKAGE.items():
        path = tmp_path / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(source))
    computed = dynamic_imports(tmp_path, PACKAGE)[1]
    graph = grimp.ImportGraph()
    for module in _modules(tmp_path, PACKAGE):
        graph.add_module(module)
    illegal = "\n".join(_illegal(with_dynamic_imports(graph, tmp_path)))
    for importer, imported in (
        ("model", "strands_slime.rollout.pacing"),
        ("chat", "strands_slime.reward"),
        ("client", "strands_slime.rollout"),
        ("tokenizer", "strands_slime.rollout.episode"),
        ("limits", "strands_slime.rollout.episode"),
        ("trajectory", "strands_slime.rollout"),
        ("constraints", "strands_slime.reward"),
    ):
        assert f"strands_slime.provider.{importer} -> {imported}" in illegal, (importer, illegal)
    assert computed == [("strands_slime.provider.telemetry", "f", 3)]


TRAJECTORY_WRITES = frozenset({"add_prompt", "add_output", "begin_turn", "rollback_turns"})
"""The methods that change a ``TokenTrajectory``."""


def _trajectory_writes(source: str, path: str) -> list[str]:
    """Where ``source`` assigns a model's trajectory or calls a method that changes one."""
    found = []
    for node in ast.walk(ast.parse(source)):
        targets = node.targets if isinstance(node, ast.Assign) else []
        for target in targets:
            if isinstance(target, ast.Attribute) and target.attr in ("trajectory", "closed_trajectories"):
                if not (isinstance(target.value, ast.Name) and target.value.id == "self"):
                    found.append(f"{path}:{node.lineno} assigns .{target.attr}")
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in TRAJECTORY_WRITES:
                found.append(f"{path}:{node.lineno} calls .{node.func.attr}()")
    return found


def test_nothing_outside_the_provider_writes_a_trajectory() -> None:
    """The episode's recorder (``provider/recorder.py``) owns the trajectories: the rollout and every other
    layer read them and ask the recorder, they never assign or edit one."""
    package = Path(__file__).resolve().parent.parent / PACKAGE
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if not relative.startswith("provider/"):
            found += _trajectory_writes(path.read_text(encoding="utf-8"), relative)
    assert not found, "\n".join(found)
    bad = "def f(model, t):\n    model.trajectory = t\n    model.trajectory.add_output([1], [0.0])\n"
    assert len(_trajectory_writes(bad, "x.py")) == 2, "the scan finds both kinds of write"
