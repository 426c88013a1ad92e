"""Structured output and ``tool_choice`` through SGLang's constrained decoding (scripted dev server).

The scripted backend checks every reply against the request's grammar with xgrammar (the engine
SGLang uses), so a reply the constraint would not admit fails the test with a 400.
"""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from enum import Enum
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from helpers import tool_call
from pydantic import BaseModel, Field
from strands import Agent, tool
from strands.agent.conversation_manager import NullConversationManager
from strands.types.exceptions import MaxTokensReachedException

from benchmarks.devserver_reference import scripted_output_logprobs
from strands_slime.devserver import DevServer
from strands_slime.provider.client import SGLangBadRequestError, SGLangClient
from strands_slime.provider.constraints import (
    ConstraintError,
    output_model_schema,
    tool_call_ebnf,
    tool_choice_names,
    unsupported_json_schema,
)
from strands_slime.provider.model import SGLangModel
from strands_slime.provider.trajectory import mask_runs

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True, scope="module")
def _needs_xgrammar() -> None:
    """Skip without xgrammar; imported when the first test runs, not at collection (it loads torch)."""
    pytest.importorskip("xgrammar")


class Color(str, Enum):
    RED = "red"
    GREEN = "green"


class Address(BaseModel):
    city: str
    zip_code: str | None = None


class Person(BaseModel):
    """A person record."""

    name: str
    age: int = Field(ge=0, le=150)
    favourite: Color
    address: Address
    nickname: str | None = None
    tags: list[str] = Field(default_factory=list)


PERSON = {
    "name": "Zoë Ångström 🚀",
    "age": 36,
    "favourite": "green",
    "address": {"city": "Zürich", "zip_code": None},
    "tags": ["α", "β"],
}


@tool
async def lookup(city: str, limit: int) -> str:
    """Look a city up.

    Args:
        city: City name.
        limit: How many results.
    """
    return f"{city}:{limit}"


@pytest.fixture
async def scripted() -> AsyncIterator[Any]:
    servers: list[DevServer] = []
    clients: list[SGLangClient] = []

    async def start(script: Any) -> tuple[DevServer, SGLangClient]:
        server = await DevServer(backend="scripted", script=script).start()
        client = SGLangClient(server.url, max_retries=0)
        servers.append(server)
        clients.append(client)
        return server, client

    yield start
    for client in clients:
        await client.close()
    for server in servers:
        await server.stop()


def thinking_only_template(tokenizer: Any) -> str:
    """Qwen3's template with a generation prompt that opens ``<think>`` itself."""
    template = tokenizer.chat_template
    start = template.index("{%- if add_generation_prompt %}")
    return (
        template[:start]
        + "{%- if add_generation_prompt %}\n    {{- '<|im_start|>assistant\\n<think>\\n' }}\n{%- endif %}\n"
    )


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": [{"text": text}]}]


def output_ids(model: SGLangModel) -> list[int]:
    return [
        tok
        for value, start, end in mask_runs(model.trajectory.loss_mask)
        if value == 1
        for tok in model.trajectory.token_ids[start:end].tolist()
    ]


async def collect(events: Any) -> list[dict[str, Any]]:
    return [event async for event in events]


def tool_uses(events: list[dict[str, Any]]) -> list[tuple[str, dict[str, Any]]]:
    names = [
        e["contentBlockStart"]["start"]["toolUse"]["name"]
        for e in events
        if "toolUse" in e.get("contentBlockStart", {}).get("start", {})
    ]
    inputs = [
        json.loads(e["contentBlockDelta"]["delta"]["toolUse"]["input"])
        for e in events
        if "toolUse" in e.get("contentBlockDelta", {}).get("delta", {})
    ]
    return list(zip(names, inputs, strict=True))


# --------------------------------------------------------------------------- structured_output()


async def test_structured_output_nested_enum_optional_unicode(qwen3_tokenizer: Any, scripted: Any) -> None:
    server, client = await scripted([{"replies": [json.dumps(PERSON, ensure_ascii=False)]}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    events = await collect(model.structured_output(Person, user("Describe Zoë."), system_prompt="Be exact."))

    output = events[-1]["output"]
    assert output == Person.model_validate(PERSON)
    assert output.favourite is Color.GREEN and output.address.zip_code is None
    request = server.request_log[-1]["json"]
    assert json.loads(request["sampling_params"]["json_schema"]) == Person.model_json_schema()
    # The turn is a normal trajectory turn: mask 1 over the sampled ids, the server's logprobs.
    sampled = output_ids(model)
    assert sampled == model.trajectory.token_ids[len(request["input_ids"]) :].tolist()
    assert model.trajectory.logprobs[-len(sampled) :].tolist() == pytest.approx(
        scripted_output_logprobs(request["input_ids"], sampled)
    )
    model.trajectory.check()


async def test_reply_that_violates_the_schema_is_refused(qwen3_tokenizer: Any, scripted: Any) -> None:
    bad = {**PERSON, "favourite": "purple"}
    _, client = await scripted([{"replies": [json.dumps(bad)]}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    with pytest.raises(SGLangBadRequestError, match="violates the request's json constraint"):
        await collect(model.structured_output(Person, user("Describe.")))
    assert len(model.trajectory) == 0


async def test_truncated_json_raises_max_tokens_not_a_parse_error(
    qwen3_tokenizer: Any, scripted: Any
) -> None:
    _, client = await scripted([{"replies": [json.dumps(PERSON)]}])
    model = SGLangModel(qwen3_tokenizer, client=client, max_response_tokens=6)
    with pytest.raises(MaxTokensReachedException, match="cut at the token limit"):
        await collect(model.structured_output(Person, user("Describe.")))
    assert model.stats.last_finish_reason == "length"
    assert len(output_ids(model)) == 6  # the truncated turn stays in the trajectory


async def test_structured_output_after_a_reasoning_block_the_prompt_opened(
    qwen3_tokenizer: Any, scripted: Any
) -> None:
    thinking_only = thinking_only_template(qwen3_tokenizer)
    reply = "Ages are integers.\n</think>\n\n" + json.dumps(PERSON)
    server, client = await scripted([{"replies": [reply]}])
    model = SGLangModel(qwen3_tokenizer, client=client, chat_template=thinking_only)
    events = await collect(model.structured_output(Person, user("Describe.")))
    assert events[-1]["output"].name == PERSON["name"]
    assert "ebnf" in server.request_log[-1]["json"]["sampling_params"]


async def test_a_second_constraint_is_refused_before_sending(qwen3_tokenizer: Any, scripted: Any) -> None:
    server, client = await scripted([{"replies": ["{}"]}])
    model = SGLangModel(qwen3_tokenizer, client=client, sampling_params={"regex": "[a-z]+"})
    with pytest.raises(ConstraintError, match="only one of json_schema, regex, ebnf, structural_tag"):
        await collect(model.structured_output(Person, user("Describe.")))
    assert server.request_log == []


# --------------------------------------------------------------------------- Strands Agent


def agent(model: SGLangModel, **kwargs: Any) -> Agent:
    return Agent(
        model=model,
        tools=[lookup],
        callback_handler=None,
        conversation_manager=NullConversationManager(),
        retry_strategy=None,
        **kwargs,
    )


async def test_agent_structured_output_model_forces_the_output_tool(
    qwen3_tokenizer: Any, scripted: Any
) -> None:
    forced = tool_call("", name="Person").replace('{"code": ""}', json.dumps(PERSON, ensure_ascii=False))
    server, client = await scripted([{"replies": ["Zoë is 36 and likes green.", forced]}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    result = await agent(model, structured_output_model=Person).invoke_async("Who is Zoë?")

    assert result.structured_output == Person.model_validate(PERSON)
    first, second = (entry["json"]["sampling_params"] for entry in server.request_log)
    assert "ebnf" not in first  # the free first turn is unconstrained
    assert '\\"name\\": \\"Person\\"' in second["ebnf"] or '"Person"' in second["ebnf"]
    assert model.trajectory.num_outputs == 2
    model.trajectory.check()


async def test_agent_structured_output_truncated_is_max_tokens(qwen3_tokenizer: Any, scripted: Any) -> None:
    forced = tool_call("", name="Person").replace('{"code": ""}', json.dumps(PERSON))
    _, client = await scripted([{"replies": ["Zoë.", forced]}])
    model = SGLangModel(qwen3_tokenizer, client=client, max_response_tokens=40)
    with pytest.raises(MaxTokensReachedException):
        await agent(model, structured_output_model=Person).invoke_async("Who is Zoë?")
    assert model.stats.finish_reasons == ["stop", "length"]


# --------------------------------------------------------------------------- tool_choice


SPECS = [lookup.tool_spec]


@pytest.mark.parametrize("choice", [{"tool": {"name": "lookup"}}, {"any": {}}])
async def test_forced_tool_choice_sends_a_grammar(qwen3_tokenizer: Any, scripted: Any, choice: Any) -> None:
    call = (
        "<tool_call>\n"
        + json.dumps({"name": "lookup", "arguments": {"city": "Zürich", "limit": 3}})
        + "\n</tool_call>"
    )
    server, client = await scripted([{"replies": [f"<think>\nUse the tool.\n</think>\n\n{call}"]}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    events = await collect(model.stream(user("Find Zürich."), SPECS, tool_choice=choice))
    assert tool_uses(events) == [("lookup", {"city": "Zürich", "limit": 3})]
    assert "ebnf" in server.request_log[-1]["json"]["sampling_params"]


async def test_auto_tool_choice_adds_no_constraint(qwen3_tokenizer: Any, scripted: Any) -> None:
    server, client = await scripted([{"replies": ["No tool needed."]}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    await collect(model.stream(user("Hi."), SPECS, tool_choice={"auto": {}}))
    params = server.request_log[-1]["json"]["sampling_params"]
    assert not {"ebnf", "json_schema", "regex"} & set(params)


async def test_forced_tool_choice_refuses_plain_text(qwen3_tokenizer: Any, scripted: Any) -> None:
    _, client = await scripted([{"replies": ["I will not call it."]}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    with pytest.raises(SGLangBadRequestError, match="violates the request's ebnf constraint"):
        await collect(model.stream(user("Find."), SPECS, tool_choice={"any": {}}))


async def test_forced_tool_choice_refuses_wrong_argument_types(qwen3_tokenizer: Any, scripted: Any) -> None:
    call = (
        "<tool_call>\n"
        + json.dumps({"name": "lookup", "arguments": {"city": "Z", "limit": "3"}})
        + "\n</tool_call>"
    )
    _, client = await scripted([{"replies": [call]}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    with pytest.raises(SGLangBadRequestError, match="violates"):
        await collect(model.stream(user("Find."), SPECS, tool_choice={"tool": {"name": "lookup"}}))


async def test_unknown_forced_tool_fails_before_sending(qwen3_tokenizer: Any, scripted: Any) -> None:
    server, client = await scripted([{"replies": ["x"]}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    with pytest.raises(ConstraintError, match="'nope', which is not among the tools"):
        await collect(model.stream(user("Find."), SPECS, tool_choice={"tool": {"name": "nope"}}))
    assert server.request_log == []


async def test_forced_tool_choice_in_qwen3_coder_xml(qwen3_tokenizer: Any, scripted: Any) -> None:
    call = (
        "<tool_call>\n<function=lookup>\n<parameter=city>\nSão Paulo\n</parameter>\n"
        "<parameter=limit>\n2\n</parameter>\n</function>\n</tool_call>"
    )
    server, client = await scripted([{"replies": [call]}])
    model = SGLangModel(qwen3_tokenizer, client=client, tool_parser="qwen3_coder", enable_thinking=False)
    events = await collect(model.stream(user("Find."), SPECS, tool_choice={"tool": {"name": "lookup"}}))
    assert tool_uses(events) == [("lookup", {"city": "São Paulo", "limit": 2})]
    assert "<function=lookup>" in server.request_log[-1]["json"]["sampling_params"]["ebnf"]


# --------------------------------------------------------------------------- dev server (scripted)


PROMPT = [151644, 872, 198, 13048, 151645, 198, 151644, 77091, 198]  # "<|im_start|>user\nHi<|im_end|>\n..."


@pytest.mark.parametrize(
    ("params", "reply"),
    [
        ({"regex": "(yes|no)!"}, "yes!"),
        ({"ebnf": 'root ::= "A" [0-9]+'}, "A42"),
        ({"json_schema": "$$ANY$$"}, '[1, {"a": null}]'),
        ({"json_schema": json.dumps(Person.model_json_schema())}, json.dumps(PERSON, ensure_ascii=False)),
    ],
)
async def test_scripted_reply_admitted_by_its_constraint(scripted: Any, params: Any, reply: str) -> None:
    _, client = await scripted([{"replies": [reply]}])
    response = await client.generate(PROMPT, params)
    assert response.text == reply
    assert response.finish_reason is not None and response.finish_reason.matched == 151645


@pytest.mark.parametrize(
    ("params", "reply", "message"),
    [
        ({"regex": "(yes|no)!"}, "maybe", "violates the request's regex constraint at token 0"),
        ({"ebnf": 'root ::= "A" [0-9]+'}, "A", "violates the request's ebnf constraint at token 1"),
        ({"json_schema": '{"type": "object"}'}, '{"a": 1', "violates the request's json constraint"),
        (
            {"json_schema": "{bad"},
            "{}",
            "Failed to compile json grammar: Expecting property name enclosed in double quotes: line 1 column 2",
        ),
        ({"regex": "("}, "x", "Failed to compile regex grammar: "),
        ({"ebnf": "root ::= "}, "x", "Failed to compile ebnf grammar: "),
        ({"regex": "a\u0000"}, "a", "Failed to compile regex grammar: Invalid regex: NUL bytes"),
        ({"structural_tag": "{}"}, "x", "does not implement structural_tag"),
        (  # SGLang refuses what xgrammar would silently not enforce, with these words
            {"json_schema": json.dumps({"type": "array", "uniqueItems": True})},
            "[]",
            "Failed to compile json grammar: JSON Schema at # is not supported by xgrammar: "
            "keyword(s) uniqueItems would be ignored",
        ),
        (
            {"json_schema": json.dumps({"properties": {"a/b": {"type": "string", "format": "path"}}})},
            "{}",
            "JSON Schema at #/properties/a~1b is not supported by xgrammar: string format 'path' is not implemented",
        ),
        (
            {"json_schema": json.dumps({"type": "string", "pattern": "a+", "maxLength": 3})},
            '"a"',
            "JSON Schema at # is not supported by xgrammar: constraints pattern, minLength/maxLength cannot be "
            "enforced together",
        ),
        (
            {"json_schema": json.dumps({"anyOf": [{"type": "integer"}, {"not": {"const": 1}}]})},
            "2",
            "JSON Schema at #/anyOf/1 is not supported by xgrammar: keyword(s) not would be ignored",
        ),
    ],
)
async def test_scripted_constraint_errors_are_400s(
    scripted: Any, params: Any, reply: str, message: str
) -> None:
    server, client = await scripted([{"replies": [reply]}])
    with pytest.raises(SGLangBadRequestError, match=message.replace("(", r"\(").replace(")", r"\)")) as info:
        await client.generate(PROMPT, params)
    assert info.value.status == 400
    assert server.request_log[-1]["status"] == 400


async def test_truncated_reply_is_a_valid_prefix_and_n_samples_share_the_grammar(scripted: Any) -> None:
    server, client = await scripted([{"replies": [json.dumps(PERSON)]}])
    schema = json.dumps(Person.model_json_schema())
    truncated = await client.generate(PROMPT, {"json_schema": schema, "max_new_tokens": 5})
    assert truncated.finish_reason is not None and truncated.finish_reason.type == "length"
    body = {"input_ids": PROMPT, "sampling_params": {"json_schema": schema, "n": 2}}
    async with aiohttp.ClientSession() as session, session.post(f"{server.url}/generate", json=body) as reply:
        assert reply.status == 200
        samples = await reply.json()
    assert [Person.model_validate_json(sample["text"]) for sample in samples] == [
        Person.model_validate(PERSON)
    ] * 2


@tool
async def shout(text: str) -> str:
    """Shout.

    Args:
        text: What to shout.
    """
    return text.upper()


async def test_any_tool_choice_admits_every_tool_after_opened_reasoning(
    qwen3_tokenizer: Any, scripted: Any
) -> None:
    thinking_only = thinking_only_template(qwen3_tokenizer)
    call = "<tool_call>\n" + json.dumps({"name": "shout", "arguments": {"text": "hé"}}) + "\n</tool_call>"
    _, client = await scripted([{"replies": [f"Shouting fits.\n</think>\n\n{call}"]}])
    model = SGLangModel(qwen3_tokenizer, client=client, chat_template=thinking_only)
    events = await collect(
        model.stream(user("Say hé."), [lookup.tool_spec, shout.tool_spec], tool_choice={"any": {}})
    )
    assert tool_uses(events) == [("shout", {"text": "hé"})]
    assert model.last_reply is not None and model.last_reply.parsed.reasoning == "Shouting fits."
    # The same reply without the closing </think> is not admitted: the call must follow the reasoning.
    _, client = await scripted([{"replies": [call]}])
    model = SGLangModel(qwen3_tokenizer, client=client, chat_template=thinking_only)
    with pytest.raises(SGLangBadRequestError, match="violates"):
        await collect(
            model.stream(user("Say hé."), [shout.tool_spec], tool_choice={"tool": {"name": "shout"}})
        )


# --------------------------------------------------------------------------- constraint building


@pytest.mark.parametrize(
    ("choice", "message"),
    [
        ({"any": {}}, "'any' needs at least one tool"),
        ({"tool": {"name": "lookup"}}, "not among the tools (none)"),
        ({"required": {}}, "unknown tool_choice"),
    ],
)
def test_bad_tool_choice_is_a_clear_error(choice: Any, message: str) -> None:
    with pytest.raises(ConstraintError, match=re.escape(message)):
        tool_choice_names(choice, [])


def test_auto_and_missing_tool_choice_add_nothing() -> None:
    assert tool_choice_names(None, SPECS) is None
    assert tool_choice_names({"auto": {}}, SPECS) is None
    assert tool_choice_names({"any": {}}, [lookup.tool_spec, shout.tool_spec]) == ["lookup", "shout"]


def test_unsupported_parser_and_non_pydantic_output_are_refused() -> None:
    with pytest.raises(ConstraintError, match="hermes and qwen3_coder"):
        tool_call_ebnf(SPECS, ["lookup"], "llama3_json")
    with pytest.raises(ConstraintError, match="needs a pydantic model class"):
        output_model_schema(dict)


async def test_deprecated_agent_structured_output_calls_the_provider(
    qwen3_tokenizer: Any, scripted: Any
) -> None:
    server, client = await scripted([{"replies": [json.dumps(PERSON, ensure_ascii=False)]}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    with pytest.warns(DeprecationWarning):
        person = await agent(model).structured_output_async(Person, "Describe Zoë.")
    assert person == Person.model_validate(PERSON)
    assert "json_schema" in server.request_log[-1]["json"]["sampling_params"]
    assert model.trajectory.num_outputs == 1


class Tagged(BaseModel):
    """A ``set[...]`` field: pydantic's schema says ``uniqueItems``, which SGLang refuses."""

    name: str
    tags: set[str]
    uniqueItems: int = Field(0, description="a property of that name stays")


async def test_structured_output_with_a_set_field_sends_a_schema_sglang_accepts(
    qwen3_tokenizer: Any, scripted: Any
) -> None:
    assert "uniqueItems" in json.dumps(Tagged.model_json_schema())
    server, client = await scripted([{"replies": ['{"name": "x", "tags": ["a", "b", "a"]}']}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    events = await collect(model.structured_output(Tagged, user("Tag it.")))
    assert events[-1]["output"] == Tagged(name="x", tags={"a", "b"})  # the set removes the duplicate
    sent = json.loads(server.request_log[-1]["json"]["sampling_params"]["json_schema"])
    assert sent["properties"]["tags"] == {"items": {"type": "string"}, "title": "Tags", "type": "array"}
    assert "uniqueItems" in sent["properties"]
    assert unsupported_json_schema(sent) is None


class Filed(BaseModel):
    where: Path


async def test_an_output_model_sglang_would_refuse_stops_before_the_request(
    qwen3_tokenizer: Any, scripted: Any
) -> None:
    server, client = await scripted([{"replies": ['{"where": "/tmp"}']}])
    model = SGLangModel(qwen3_tokenizer, client=client)
    message = (
        "SGLang would refuse the JSON schema of Filed: JSON Schema at #/properties/where is not supported by "
        "xgrammar: string format 'path' is not implemented"
    )
    with pytest.raises(ConstraintError, match=re.escape(message)):
        await collect(model.structured_output(Filed, user("Where?")))
    assert server.request_log == [] and len(model.trajectory) == 0
