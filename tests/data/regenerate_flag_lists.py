"""Regenerate the flag lists that tests/test_scripts.py checks our launch scripts against.

slime's ``train.py`` parses three argument sets: Megatron-LM's (``add_megatron_arguments``), slime's
own (its extra-args provider plus the pre-parsed mode flags) and the ``--sglang-*``/``--router-*``
flags that slime derives from SGLang's ``ServerArgs`` and the router's ``RouterArgs``. Unknown flags
are silently ignored there, so a typo in a launch script costs a whole GPU job; these lists catch it.

Rather than scraping source text (Megatron and SGLang build many flags from dataclass fields), this
script runs the real upstream argparse builders on a CPU machine. Imports that only work on a GPU
box are replaced by inert stand-ins, discovered by retrying the import; the stand-ins never add
flags, and the list of what was stubbed goes into each file header.

Upstream trees are not vendored. Example (paths are wherever you checked the sources out):

    python tests/data/regenerate_flag_lists.py \\
        --megatron /src/Megatron-LM --slime /src/slime --sglang /src/sglang-site \\
        --megatron-rev "NVIDIA/Megatron-LM 1dcf0da... + slime docker/patch/latest/megatron*.patch" \\
        --slime-rev "THUDM/slime 624b824..." --sglang-rev "sglang 0.5.15.post1 + ..., sglang-router 0.3.2"

``--sglang`` is a directory holding the ``sglang`` and ``sglang_router`` packages (an unpacked wheel).
"""

from __future__ import annotations

import argparse
import ast
import datetime
import enum
import importlib.abc
import importlib.machinery
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from unittest import mock

# Modules whose code we call: stubbing them would hide the very flags we want.
_MUST_IMPORT = {
    "megatron.training.arguments",
    "slime.utils.arguments",
    "slime.backends.sglang_utils.arguments",
    "sglang.srt.server_args",
    "sglang_router.launch_router",
    "sglang_router.router_args",
}
# Stubbing these confuses torch/transformers feature probes; stub the importing module instead.
_NEVER_STUB_TOP_LEVEL = {"torch", "transformers", "triton", "torchvision", "numpy", "packaging"}
_MAX_STUB_ROUNDS = 120


class _StubFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Serves a MagicMock module for each named module (and its submodules)."""

    def __init__(self, names: list[str]) -> None:
        self._names = names

    def find_spec(self, fullname, path, target=None):
        if any(fullname == name or fullname.startswith(name + ".") for name in self._names):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = mock.MagicMock(name=spec.name)
        module.__path__ = []
        module.__spec__ = spec
        module.__name__ = spec.name
        return module

    def exec_module(self, module) -> None:
        return None


def _cli_spelling(choice: object) -> str:
    """How a choice is typed on the command line (enum choices are parsed from their member names)."""
    return choice.name if isinstance(choice, enum.Enum) else str(choice)


def _long_flags(parser: argparse.ArgumentParser) -> dict[str, list[str] | None]:
    """Every long option of the parser, with its allowed values when argparse restricts them."""
    flags: dict[str, list[str] | None] = {}
    for flag, action in parser._option_string_actions.items():
        if flag.startswith("--") and flag != "--help":
            flags[flag] = (
                [_cli_spelling(choice) for choice in action.choices] if action.choices is not None else None
            )
    return flags


def _child_phase(phase: str, convert_tool: str) -> dict[str, list[str] | None]:
    """Build one upstream parser in this process and return its long flags (with choices)."""
    if phase == "megatron":
        from megatron.training.arguments import add_megatron_arguments

        parser = argparse.ArgumentParser(allow_abbrev=False)
        add_megatron_arguments(parser)
        return _long_flags(parser)

    if phase == "slime":
        from megatron.training.arguments import add_megatron_arguments
        from slime.utils import arguments as slime_arguments

        parser = argparse.ArgumentParser(allow_abbrev=False)
        add_megatron_arguments(parser)
        megatron_flags = _long_flags(parser)
        slime_arguments.get_slime_extra_args_provider()(parser)
        flags = {flag: choices for flag, choices in _long_flags(parser).items() if flag not in megatron_flags}
        # The mode flags live on a throwaway parser inside _pre_parse_mode; capture it.
        captured: list[argparse.ArgumentParser] = []
        original = argparse.ArgumentParser.parse_known_args

        def capture(self, args=None, namespace=None):
            captured.append(self)
            return original(self, [], namespace)

        with mock.patch.object(argparse.ArgumentParser, "parse_known_args", capture):
            slime_arguments._pre_parse_mode()
        for pre_parser in captured:
            flags |= _long_flags(pre_parser)
        return flags

    if phase == "sglang":
        from slime.backends.sglang_utils.arguments import add_sglang_arguments

        parser = argparse.ArgumentParser(add_help=False)
        add_sglang_arguments(parser)
        return _long_flags(parser)

    if phase == "convert":
        # Run only the converter's own add-arguments function; the rest of the tool needs a GPU.
        tree = ast.parse(Path(convert_tool).read_text())
        function = next(
            node
            for node in tree.body
            if isinstance(node, ast.FunctionDef) and node.name == "add_convertion_args"
        )
        namespace: dict = {}
        exec(compile(ast.Module(body=[function], type_ignores=[]), convert_tool, "exec"), namespace)
        parser = argparse.ArgumentParser(allow_abbrev=False)
        namespace["add_convertion_args"](parser)
        return _long_flags(parser)

    raise ValueError(f"unknown phase {phase!r}")


def _module_of_frame(path: str, roots: list[Path]) -> str | None:
    for root in roots:
        try:
            relative = Path(path).resolve().relative_to(root.resolve())
        except ValueError:
            continue
        parts = list(relative.with_suffix("").parts)
        if parts[-1] == "__init__":
            parts.pop()
        return ".".join(parts)
    return None


def _run_phase(
    phase: str, roots: list[Path], convert_tool: str
) -> tuple[dict[str, list[str] | None], list[str]]:
    """Run a phase in a child process, stubbing failing imports until the parser builds."""
    stubs: list[str] = []
    for _ in range(_MAX_STUB_ROUNDS):
        command = [
            sys.executable,
            "-W",
            "ignore",
            __file__,
            "--child",
            phase,
            "--stubs",
            json.dumps(stubs),
            "--convert-tool",
            convert_tool,
        ]
        env_path = ":".join(str(root) for root in roots)
        result = subprocess.run(
            command, capture_output=True, text=True, env={**os.environ, "PYTHONPATH": env_path}
        )
        if result.returncode == 0:
            return json.loads(result.stdout.strip().splitlines()[-1]), stubs
        missing = re.search(r"No module named '([^']+)'", result.stderr)
        if missing and missing.group(1).split(".")[0] not in _NEVER_STUB_TOP_LEVEL:
            stubs.append(missing.group(1))
            continue
        frames = re.findall(r'File "([^"]+\.py)", line \d+, in <module>', result.stderr)
        modules = [_module_of_frame(frame, roots) for frame in frames]
        candidates = [m for m in modules if m and m not in _MUST_IMPORT and m not in stubs]
        if not candidates:
            raise RuntimeError(f"phase {phase} failed and nothing is left to stub:\n{result.stderr[-4000:]}")
        stubs.append(candidates[-1])
    raise RuntimeError(f"phase {phase}: gave up after {_MAX_STUB_ROUNDS} stub rounds: {stubs}")


def _write(
    path: Path, title: str, sources: list[str], stubs: list[str], flags: dict[str, list[str] | None]
) -> None:
    today = datetime.date.today().isoformat()
    header = [f"# {title}", *(f"# source: {source}" for source in sources)]
    header.append(f"# generated {today} by tests/data/regenerate_flag_lists.py (real argparse builders)")
    header.append(
        "# format: one flag per line, then its allowed values as a JSON list when argparse restricts them"
    )
    if stubs:
        header.append("# imports stubbed on the CPU box: " + ", ".join(sorted(set(stubs))))
    lines = [
        flag if choices is None else f"{flag} {json.dumps(choices)}"
        for flag, choices in sorted(flags.items())
    ]
    path.write_text("\n".join([*header, *lines]) + "\n")
    print(f"{path}: {len(flags)} flags")


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--stubs", default="[]", help=argparse.SUPPRESS)
    parser.add_argument("--convert-tool", default="", help=argparse.SUPPRESS)
    parser.add_argument("--megatron", type=Path)
    parser.add_argument("--slime", type=Path)
    parser.add_argument("--sglang", type=Path)
    parser.add_argument("--megatron-rev", default="unknown")
    parser.add_argument("--slime-rev", default="unknown")
    parser.add_argument("--sglang-rev", default="unknown")
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent)
    args = parser.parse_args()

    if args.child:
        sys.meta_path.insert(0, _StubFinder(json.loads(args.stubs)))
        print(json.dumps(_child_phase(args.child, args.convert_tool)))
        return

    if not (args.megatron and args.slime and args.sglang):
        parser.error("--megatron, --slime and --sglang are required")
    roots = [args.megatron, args.slime, args.sglang]
    convert_tool = str(args.slime / "tools" / "convert_hf_to_torch_dist.py")
    slime_src = f"{args.slime_rev}: slime/utils/arguments.py"

    flags, stubs = _run_phase("megatron", roots, convert_tool)
    _write(
        args.out / "megatron_flags.txt",
        "Megatron-LM flags (megatron.training.arguments.add_megatron_arguments), as slime's image builds it",
        [args.megatron_rev],
        stubs,
        flags,
    )
    flags, stubs = _run_phase("slime", roots, convert_tool)
    _write(
        args.out / "slime_flags.txt",
        "slime's own train.py flags (extra-args provider + pre-parsed mode flags), Megatron's excluded",
        [slime_src],
        stubs,
        flags,
    )
    flags, stubs = _run_phase("sglang", roots, convert_tool)
    _write(
        args.out / "sglang_flags.txt",
        "train.py's SGLang phase: slime add_sglang_arguments (--sglang-* ServerArgs, --router-* RouterArgs)",
        [f"{args.slime_rev}: slime/backends/sglang_utils/arguments.py", args.sglang_rev],
        stubs,
        flags,
    )
    flags, stubs = _run_phase("convert", roots, convert_tool)
    _write(
        args.out / "convert_flags.txt",
        "tools/convert_hf_to_torch_dist.py's own flags (it also takes every Megatron flag; parsing is strict)",
        [f"{args.slime_rev}: tools/convert_hf_to_torch_dist.py"],
        stubs,
        flags,
    )


if __name__ == "__main__":
    main()
