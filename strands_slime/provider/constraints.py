"""SGLang constrained-decoding parameters for structured output and ``tool_choice``.

Structured output sends the pydantic model's JSON schema as ``sampling_params.json_schema``. A forced
``tool_choice`` (``any`` or a named tool) sends an ``ebnf`` grammar in xgrammar's dialect (SGLang's
default grammar engine) that admits exactly one call in the model's native syntax (Hermes JSON or
Qwen3-Coder XML) to one of the allowed tools, its arguments constrained by the tool's input schema,
with a reasoning block before it where the chat template opens or allows ``<think>``. The sampled ids
are valid by construction and stay exactly what the trainer sees.

Building the grammar needs the ``xgrammar`` package (installed with SGLang, or
``pip install 'strands-slime[grammar]'``); it converts each JSON schema to EBNF locally, nothing is
compiled against a tokenizer here.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from strands_slime.provider.tool_parsers import THINK_CLOSE, THINK_OPEN

ReasoningMode = Literal["none", "open", "optional"]
"""``open``: the prompt already opened ``<think>``; ``optional``: the model may open one itself."""

CONSTRAINT_KEYS = ("json_schema", "regex", "ebnf", "structural_tag")
"""SGLang's mutually exclusive constraint parameters."""

_REASONING_TEXT = '([^<] | "<" [^/])*'
"""Reasoning text: anything without ``</`` (so it cannot run past ``</think>``)."""
_GAP = "[ \\n]? [ \\n]?"
"""At most two blanks between blocks, so a sampler cannot loop on whitespace."""


class ConstraintError(ValueError):
    """A ``tool_choice`` or output model that cannot be turned into a grammar."""


def _xgrammar() -> Any:
    try:
        import xgrammar
    except ImportError:
        raise ConstraintError(
            "enforcing tool_choice needs the xgrammar package (installed with SGLang; "
            "pip install 'strands-slime[grammar]')"
        ) from None
    return xgrammar


def _literal(text: str) -> str:
    """An EBNF string literal (xgrammar accepts JSON-style escapes)."""
    return json.dumps(text, ensure_ascii=False)


def output_model_schema(output_model: Any) -> str:
    """``sampling_params.json_schema`` for a pydantic model class, in a form SGLang accepts.

    ``uniqueItems`` (what pydantic writes for a ``set[...]`` field) is left out: xgrammar cannot enforce
    it, so SGLang refuses a schema with it, and the set field removes duplicates when the reply is
    validated. Any other keyword SGLang's grammar backend refuses stops here, before the request.

    Raises:
        ConstraintError: ``output_model`` has no ``model_json_schema`` (not a pydantic model class), or
            its schema uses a keyword SGLang refuses (the message is SGLang's).
    """
    schema_fn = getattr(output_model, "model_json_schema", None)
    if schema_fn is None:
        raise ConstraintError(f"structured output needs a pydantic model class, got {output_model!r}")
    schema = _without_unique_items(schema_fn())
    refused = unsupported_json_schema(schema)
    if refused is not None:
        name = getattr(output_model, "__name__", repr(output_model))
        raise ConstraintError(f"SGLang would refuse the JSON schema of {name}: {refused}")
    return json.dumps(schema, ensure_ascii=False)


def _without_unique_items(schema: Any, names: bool = False) -> Any:
    """``schema`` less its ``uniqueItems`` keywords (``names``: the keys are property or definition names,
    not keywords; instance values such as ``default`` are kept as they are)."""
    if isinstance(schema, list):
        return [_without_unique_items(value) for value in schema]
    if not isinstance(schema, dict):
        return schema
    return {
        key: value
        if not names and key in _INSTANCE_VALUES
        else _without_unique_items(value, not names and key in _SUBSCHEMA_MAPS)
        for key, value in schema.items()
        if names or key != "uniqueItems"
    }


_INSTANCE_VALUES = ("const", "default", "enum", "examples")


XGRAMMAR_IGNORED_KEYWORDS = frozenset(
    {"contains", "dependentRequired", "dependentSchemas", "else", "if", "maxContains", "minContains"}
    | {"multipleOf", "not", "then", "uniqueItems"}
)
XGRAMMAR_STRING_FORMATS = frozenset(
    {"date", "date-time", "duration", "email", "hostname", "ipv4", "ipv6", "json-pointer", "time"}
    | {"relative-json-pointer", "uri", "uri-reference", "uri-template", "uuid"}
)
"""What SGLang 0.5.23 refuses in a ``json_schema`` (``validate_xgrammar_json_schema``): keywords xgrammar
would silently not enforce, string formats it does not implement, and more than one of ``format``,
``pattern`` and a length range on one string."""
_ONE_SUBSCHEMA = ("additionalItems", "additionalProperties", "contains", "contentSchema", "else", "if")
_ONE_SUBSCHEMA += ("items", "not", "propertyNames", "then", "unevaluatedItems", "unevaluatedProperties")
_SUBSCHEMA_LISTS = ("allOf", "anyOf", "oneOf", "prefixItems")
_SUBSCHEMA_MAPS = (
    "$defs",
    "definitions",
    "dependentSchemas",
    "patternProperties",
    "properties",
    "dependencies",
)


def _subschemas(schema: Any, pointer: str = "#") -> Any:
    """Every (sub)schema of ``schema`` with its JSON pointer, parents first."""
    if not isinstance(schema, dict):
        return
    yield schema, pointer
    for key in _ONE_SUBSCHEMA:
        child = schema.get(key)
        children = enumerate(child) if key == "items" and isinstance(child, list) else [(None, child)]
        for index, item in children:
            yield from _subschemas(item, f"{pointer}/{key}" + ("" if index is None else f"/{index}"))
    for key in _SUBSCHEMA_LISTS:
        for index, item in enumerate(schema.get(key) if isinstance(schema.get(key), list) else []):
            yield from _subschemas(item, f"{pointer}/{key}/{index}")
    for key in _SUBSCHEMA_MAPS:
        children = schema.get(key)
        for name, item in children.items() if isinstance(children, dict) else []:
            yield from _subschemas(item, f"{pointer}/{key}/{name.replace('~', '~0').replace('/', '~1')}")


def unsupported_json_schema(schema: Any) -> str | None:
    """Why SGLang (xgrammar backend) refuses ``schema`` (a decoded JSON schema), in its words; None when
    it does not. The dev server answers such a ``json_schema`` as SGLang does."""
    for node, pointer in _subschemas(schema):
        where = f"JSON Schema at {pointer} is not supported by xgrammar"
        ignored = sorted(XGRAMMAR_IGNORED_KEYWORDS.intersection(node))
        if ignored:
            return f"{where}: keyword(s) {', '.join(ignored)} would be ignored"
        kind = node.get("type")
        if not (kind is None or kind == "string" or (isinstance(kind, list) and "string" in kind)):
            continue
        if "format" in node and not (
            isinstance(node["format"], str) and node["format"] in XGRAMMAR_STRING_FORMATS
        ):
            return f"{where}: string format {node['format']!r} is not implemented"
        groups = [name for name, keys in _STRING_GROUPS if any(key in node for key in keys)]
        if len(groups) > 1:
            return f"{where}: constraints {', '.join(groups)} cannot be enforced together"
    return None


_STRING_GROUPS = (
    ("format", ("format",)),
    ("pattern", ("pattern",)),
    ("minLength/maxLength", ("minLength", "maxLength")),
)


def tool_choice_names(
    tool_choice: Mapping[str, Any] | None, tool_specs: Sequence[Mapping[str, Any]] | None
) -> list[str] | None:
    """The tools one call must be made to, or None when ``tool_choice`` adds no constraint (``auto``).

    Raises:
        ConstraintError: ``any`` without tools, a named tool that is not among them, or an unknown choice.
    """
    if not tool_choice or "auto" in tool_choice:
        return None
    available = [str(spec["name"]) for spec in tool_specs or []]
    if "any" in tool_choice:
        if not available:
            raise ConstraintError("tool_choice 'any' needs at least one tool")
        return available
    if "tool" in tool_choice:
        name = (tool_choice.get("tool") or {}).get("name")
        if name not in available:
            raise ConstraintError(
                f"tool_choice names tool {name!r}, which is not among the tools ({', '.join(available) or 'none'})"
            )
        return [str(name)]
    raise ConstraintError(
        f"unknown tool_choice {dict(tool_choice)!r} (use auto, any or {{'tool': {{'name': ...}}}})"
    )


def tool_call_ebnf(
    tool_specs: Sequence[Mapping[str, Any]],
    names: Sequence[str],
    parser_name: str,
    reasoning: ReasoningMode = "none",
) -> str:
    """The ``ebnf`` admitting one call to one of ``names`` in ``parser_name``'s syntax.

    Args:
        tool_specs: Strands tool specs (their ``inputSchema`` constrains the arguments).
        names: the tools the call may be made to (see :func:`tool_choice_names`).
        parser_name: the family's tool-call format (``hermes`` or ``qwen3_coder``).
        reasoning: whether a think block comes first: ``none``, ``open`` (the prompt opened it) or
            ``optional``.

    Raises:
        ConstraintError: another tool-call format, xgrammar is missing, or a schema it cannot compile.
    """
    if parser_name not in ("hermes", "qwen3_coder"):
        raise ConstraintError(
            f"tool_choice can only be enforced for the hermes and qwen3_coder tool-call formats, not {parser_name!r}"
        )
    schemas = {str(spec["name"]): _input_schema(spec) for spec in tool_specs}
    # Property order is kept: the grammar writes properties in schema order, as the model should.
    key = json.dumps([{name: schemas[name] for name in names}, parser_name, reasoning])
    return _tool_call_ebnf_cached(key)


@functools.lru_cache(maxsize=256)
def _tool_call_ebnf_cached(key: str) -> str:
    tools, parser_name, reasoning = json.loads(key)
    xgr = _xgrammar()
    build = _qwen3_coder_call if parser_name == "qwen3_coder" else _hermes_call
    try:
        calls = [build(xgr, name, schema) for name, schema in tools.items()]
        call = calls[0] if len(calls) == 1 else xgr.Grammar.union(*calls)
        parts = []
        if reasoning == "open":
            parts.append(xgr.Grammar.from_ebnf(f"root ::= {_REASONING_TEXT} {_literal(THINK_CLOSE)} {_GAP}"))
        elif reasoning == "optional":
            block = f"{_literal(THINK_OPEN)} {_REASONING_TEXT} {_literal(THINK_CLOSE)} {_GAP}"
            parts.append(xgr.Grammar.from_ebnf(f"root ::= ({block})?"))
        parts.append(call)
        grammar = parts[0] if len(parts) == 1 else xgr.Grammar.concat(*parts)
    except (RuntimeError, ValueError) as exc:
        raise ConstraintError(f"cannot build a tool-call grammar: {exc}") from exc
    return str(grammar)


def _input_schema(spec: Mapping[str, Any]) -> dict[str, Any]:
    schema = spec.get("inputSchema", {})
    schema = schema.get("json", schema) if isinstance(schema, Mapping) else {}
    return dict(schema) if schema else {"type": "object"}


def _json(xgr: Any, schema: Mapping[str, Any]) -> Any:
    return xgr.Grammar.from_json_schema(json.dumps(schema), any_whitespace=False)


def _hermes_call(xgr: Any, name: str, schema: dict[str, Any]) -> Any:
    opening = '<tool_call>\n{"name": ' + json.dumps(name, ensure_ascii=False) + ', "arguments": '
    head = xgr.Grammar.from_ebnf(f"root ::= {_literal(opening)}")
    tail = xgr.Grammar.from_ebnf(f"root ::= {_literal('}' + chr(10) + '</tool_call>')}")
    return xgr.Grammar.concat(head, _json(xgr, schema), tail)


def _qwen3_coder_call(xgr: Any, name: str, schema: dict[str, Any]) -> Any:
    properties: dict[str, Any] = schema.get("properties") or {}
    required = [key for key in schema.get("required") or [] if key in properties]
    optional = [key for key in properties if key not in required]
    defs = {key: schema[key] for key in ("$defs", "definitions") if key in schema}
    parts = [xgr.Grammar.from_ebnf(f"root ::= {_literal(f'<tool_call>{chr(10)}<function={name}>{chr(10)}')}")]
    for key in [*required, *optional]:
        parameter = _qwen3_coder_parameter(xgr, key, properties[key], defs)
        if key in optional:
            parameter = xgr.Grammar.union(parameter, xgr.Grammar.from_ebnf('root ::= ""'))
        parts.append(parameter)
    parts.append(xgr.Grammar.from_ebnf(f"root ::= {_literal(f'</function>{chr(10)}</tool_call>')}"))
    return xgr.Grammar.concat(*parts)


def _qwen3_coder_parameter(xgr: Any, key: str, schema: Mapping[str, Any], defs: dict[str, Any]) -> Any:
    head = xgr.Grammar.from_ebnf(f"root ::= {_literal(f'<parameter={key}>{chr(10)}')}")
    tail = xgr.Grammar.from_ebnf(f"root ::= {_literal(f'{chr(10)}</parameter>{chr(10)}')}")
    resolved = _resolve_ref(schema, defs)
    options = resolved.get("enum", [resolved["const"]] if "const" in resolved else None)
    if options and all(isinstance(option, str) for option in options):
        # The template writes string values raw, so string enums are their bare words.
        value = xgr.Grammar.from_ebnf("root ::= " + " | ".join(_literal(option) for option in options))
    elif resolved.get("type") == "string" and not options:
        value = xgr.Grammar.from_ebnf("root ::= [^<\\n] [^<]*")  # raw text, as the template writes it
    else:
        value = _json(xgr, {**schema, **defs})
    return xgr.Grammar.concat(head, value, tail)


def _resolve_ref(schema: Mapping[str, Any], defs: Mapping[str, Any]) -> Mapping[str, Any]:
    """A local ``#/$defs/X`` (or ``#/definitions/X``) reference followed once; anything else as is."""
    ref = schema.get("$ref")
    if isinstance(ref, str) and ref.startswith("#/"):
        section, _, name = ref[2:].partition("/")
        target = (defs.get(section) or {}).get(name)
        if isinstance(target, Mapping):
            return target
    return schema


def json_output_ebnf(schema: str) -> str:
    """``ebnf`` for a reasoning block the prompt opened, then one JSON value matching ``schema``.

    Raises:
        ConstraintError: xgrammar is missing or cannot compile ``schema`` (a JSON schema string).
    """
    return _json_output_ebnf_cached(schema)


@functools.lru_cache(maxsize=64)
def _json_output_ebnf_cached(schema: str) -> str:
    xgr = _xgrammar()
    try:
        reasoning = xgr.Grammar.from_ebnf(f"root ::= {_REASONING_TEXT} {_literal(THINK_CLOSE)} {_GAP}")
        return str(xgr.Grammar.concat(reasoning, _json(xgr, json.loads(schema))))
    except (RuntimeError, ValueError) as exc:
        raise ConstraintError(f"cannot build a structured-output grammar: {exc}") from exc


def merge_constraint(params: dict[str, Any], constraint: Mapping[str, str] | None) -> dict[str, Any]:
    """``params`` plus ``constraint``; a second constraint would be refused by SGLang, so it fails here.

    Raises:
        ConstraintError: ``params`` already sets one of SGLang's constraint keys.
    """
    if not constraint:
        return params
    configured = [key for key in CONSTRAINT_KEYS if params.get(key)]
    if configured:
        raise ConstraintError(
            f"sampling_params already sets {configured[0]}; SGLang allows only one of "
            f"{', '.join(CONSTRAINT_KEYS)} (needed here: {next(iter(constraint))})"
        )
    return {**params, **constraint}
