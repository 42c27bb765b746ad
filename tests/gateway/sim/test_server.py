"""The simulator's HTTP answers, in process: vLLM 0.32's behaviour, request by request."""

from __future__ import annotations

from typing import Any

import orjson
import pytest

from gateway.sim.metrics import FINISHED_REASONS, exposition
from gateway.sim.server import SimServer, StreamDropped
from tests.gateway.sim.asgi import Reply, call, chat, completion, run

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
USAGE_EVERYWHERE = {"stream_options": {"include_usage": True, "continuous_usage_stats": True}}
TOOLS = [
    {"type": "function", "function": {"name": name, "parameters": {"type": "object"}}}
    for name in ("a", "b")
]


def metric(server: SimServer, sample: str) -> float:
    """A sample's value on /metrics, named with its labels."""
    for line in exposition(server.collector).decode().splitlines():
        name, _, value = line.rpartition(" ")
        if name == sample:
            return float(value)
    raise AssertionError(f"no sample {sample}")


def success(server: SimServer, reason: str) -> float:
    labels = f'engine="0",finished_reason="{reason}",model_name="sim-test"'
    return metric(server, f"vllm:request_success_total{{{labels}}}")


def assert_vllm_400(reply: Reply) -> dict[str, Any]:
    assert reply.status == 400, reply.body
    error: dict[str, Any] = reply.json()["error"]
    assert error["type"] == "BadRequestError" and error["code"] == 400
    return error


# -- streaming ---------------------------------------------------------------------------------
def test_continuous_usage_stats_put_each_choices_running_usage_in_every_chat_event() -> None:
    async def check(server: SimServer) -> None:
        body = chat(stream=True, max_tokens=6, ignore_eos=True, n=2, seed=3, **USAGE_EVERYWHERE)
        events = (await call(server, "POST", CHAT, body)).events()
        *per_choice, final = events
        roles = [e for e in per_choice if "role" in e["choices"][0]["delta"]]
        assert [e["usage"]["completion_tokens"] for e in roles] == [0, 0]
        assert roles[0]["usage"]["completion_tokens_details"] is None
        prompt = roles[0]["usage"]["prompt_tokens"]
        for index in (0, 1):
            mine = [e["usage"] for e in per_choice if e["choices"][0]["index"] == index]
            counts = [usage["completion_tokens"] for usage in mine]
            assert counts == sorted(counts) and counts[-1] == 6  # its own running count
            assert all(u["total_tokens"] == prompt + u["completion_tokens"] for u in mine)
        assert final["choices"] == [] and final["usage"]["completion_tokens"] == 12

    run(check)


def test_continuous_usage_stats_in_completions_and_only_with_include_usage() -> None:
    async def check(server: SimServer) -> None:
        body = completion(stream=True, max_tokens=4, ignore_eos=True, **USAGE_EVERYWHERE)
        *per_choice, final = (await call(server, "POST", COMPLETIONS, body)).events()
        assert per_choice and all(
            set(e["usage"]) == {"prompt_tokens", "total_tokens", "completion_tokens"}
            for e in per_choice
        )
        assert per_choice[-1]["usage"]["completion_tokens"] == 4
        assert final["usage"]["completion_tokens"] == 4
        # continuous_usage_stats alone asks for nothing (vLLM's should_include_usage)
        alone = completion(stream=True, stream_options={"continuous_usage_stats": True})
        events = (await call(server, "POST", COMPLETIONS, alone)).events()
        assert not any("usage" in e for e in events)

    run(check)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_n_choices_stream_one_choice_per_event(path: str) -> None:
    async def check(server: SimServer) -> None:
        fields = {"stream": True, "n": 3, "max_tokens": 5, "ignore_eos": True, "seed": 1}
        body = chat(**fields) if path == CHAT else completion(**fields)
        events = (await call(server, "POST", path, body)).events()
        assert all(len(event["choices"]) == 1 for event in events)
        if path == CHAT:
            roles = [e["choices"][0]["index"] for e in events if "role" in e["choices"][0]["delta"]]
            assert roles == [0, 1, 2]
        finished = [e for e in events if e["choices"][0]["finish_reason"] is not None]
        assert sorted(e["choices"][0]["index"] for e in finished) == [0, 1, 2]
        # without a usage event, each choice's last event names the system, as in vLLM
        assert all(e.get("system_fingerprint") for e in finished)

    run(check)


# -- tool calls --------------------------------------------------------------------------------
def named(name: str) -> dict[str, Any]:
    return {"type": "function", "function": {"name": name}}


def test_a_named_tool_choice_calls_that_function_and_finishes_with_stop() -> None:
    async def check(server: SimServer) -> None:
        body = chat(tools=TOOLS, tool_choice=named("b"), n=2, seed=1)
        choices = (await call(server, "POST", CHAT, body)).json()["choices"]
        calls = [choice["message"]["tool_calls"][0] for choice in choices]
        assert [c["function"]["name"] for c in calls] == ["b", "b"]
        assert [choice["finish_reason"] for choice in choices] == ["stop", "stop"]
        assert calls[0]["id"] != calls[1]["id"]  # each choice its own call
        assert choices[0]["message"]["content"] == ""  # vLLM: `content or ""` when forced

        auto = (await call(server, "POST", CHAT, chat(tools=TOOLS, n=2, seed=1))).json()
        assert [c["finish_reason"] for c in auto["choices"]] == ["tool_calls", "tool_calls"]
        assert auto["choices"][0]["message"]["tool_calls"][0]["function"]["name"] == "a"

        streamed = chat(tools=TOOLS, tool_choice=named("b"), stream=True)
        events = (await call(server, "POST", CHAT, streamed)).events()
        deltas = [e["choices"][0]["delta"] for e in events]
        assert [d["tool_calls"][0]["function"]["name"] for d in deltas if "tool_calls" in d] == [
            "b"
        ]
        assert events[-1]["choices"][0]["finish_reason"] == "stop"

    run(check)


def test_a_tool_call_cut_by_max_tokens_is_what_vllm_makes_of_cut_output() -> None:
    async def check(server: SimServer) -> None:
        whole = await call(server, "POST", CHAT, chat(tools=TOOLS, tool_choice=named("b")))
        arguments = whole.json()["choices"][0]["message"]["tool_calls"][0]["function"]["arguments"]
        # named: the call keeps the arguments generated so far
        cut = (
            await call(
                server, "POST", CHAT, chat(tools=TOOLS, tool_choice=named("b"), max_tokens=3)
            )
        ).json()
        choice = cut["choices"][0]
        partial = choice["message"]["tool_calls"][0]["function"]["arguments"]
        assert choice["finish_reason"] == "length" and cut["usage"]["completion_tokens"] == 3
        assert arguments.startswith(partial) and partial != arguments
        # auto: a cut call does not parse as one; the output comes back as text
        auto = (await call(server, "POST", CHAT, chat(tools=TOOLS, max_tokens=3))).json()
        message = auto["choices"][0]["message"]
        assert auto["choices"][0]["finish_reason"] == "length"
        assert "tool_calls" not in message and message["content"] == partial

    run(check)


def test_a_stop_string_cuts_a_tool_call_as_any_output() -> None:
    """vLLM matches stop strings on the generated text before a tool parser reads it."""

    async def check(server: SimServer) -> None:
        stop = {"stop": ["never there", "query"]}
        body = chat(tools=TOOLS, tool_choice=named("b"), **stop)
        cut = (await call(server, "POST", CHAT, body)).json()
        choice = cut["choices"][0]
        arguments = choice["message"]["tool_calls"][0]["function"]["arguments"]
        assert arguments == '{"' and choice["finish_reason"] == "stop"  # named: kept as cut
        assert choice["stop_reason"] == "query" and cut["usage"]["completion_tokens"] == 3
        # auto: the cut call does not parse as one; the text before the stop string remains
        auto = (await call(server, "POST", CHAT, chat(tools=TOOLS, **stop))).json()
        message, reason = auto["choices"][0]["message"], auto["choices"][0]["finish_reason"]
        assert "tool_calls" not in message and message["content"] == '{"' and reason == "stop"

    run(check)


def test_a_named_tool_choice_must_name_one_of_the_tools() -> None:
    async def check(server: SimServer) -> None:
        reply = await call(server, "POST", CHAT, chat(tools=TOOLS, tool_choice=named("c")))
        assert "does not match any" in assert_vllm_400(reply)["message"]

    run(check)


@pytest.mark.parametrize(
    ("fields", "param", "message"),
    [
        ({"tools": []}, "tools", "`tools` must not be an empty array."),
        ({"tool_choice": "auto"}, "tool_choice", "When using `tool_choice`, `tools` must be set."),
        ({"tool_choice": "required"}, "tool_choice", "`tools` must be set."),
        ({"tools": TOOLS, "tool_choice": "any"}, "tool_choice", "Invalid value for `tool_choice`"),
    ],
    ids=["empty-tools", "auto-without-tools", "required-without-tools", "unknown-choice"],
)
def test_tools_and_tool_choice_that_do_not_go_together_are_vllms_400(
    fields: dict[str, Any], param: str, message: str
) -> None:
    """vLLM's request model (check_tool_usage) refuses these; "none" needs no tools."""

    async def check(server: SimServer) -> None:
        error = assert_vllm_400(await call(server, "POST", CHAT, chat(**fields)))
        assert error["param"] == param and message in error["message"], error
        assert (await call(server, "POST", CHAT, chat(tool_choice="none"))).status == 200

    run(check)


@pytest.mark.parametrize(
    ("tool_choice", "message"),
    [
        ("required", "Tool choice 'required' must be specified with 'tools' parameter."),
        ({"type": "function", "name": "a"}, "Tool choice 'function' not found in 'tools'"),
        ({"type": "custom", "name": "a"}, "Tool choice 'function' not found in 'tools'"),
    ],
    ids=["required", "named", "custom"],
)
def test_a_responses_tool_choice_that_needs_tools_without_them_is_vllms_400(
    tool_choice: Any, message: str
) -> None:
    """vLLM's ResponsesRequest.check_tool_usage; without tools "auto" is "none"."""

    async def check(server: SimServer) -> None:
        body = {"model": "sim-test", "input": "hi", "max_output_tokens": 4}
        reply = await call(server, "POST", "/v1/responses", body | {"tool_choice": tool_choice})
        error = assert_vllm_400(reply)
        assert error["param"] == "tool_choice" and message in error["message"], error
        auto = await call(server, "POST", "/v1/responses", body | {"tool_choice": "auto"})
        assert auto.status == 200, auto.body
        tools = [{"type": "function", "name": "a", "parameters": {"type": "object"}}]
        with_tools = body | {"tool_choice": tool_choice, "tools": tools}
        answered = await call(server, "POST", "/v1/responses", with_tools)
        assert answered.status == 200, answered.body  # with tools it asks for nothing missing

    run(check)


# -- stop strings ------------------------------------------------------------------------------
async def answer_text(server: SimServer, **fields: Any) -> tuple[str, int]:
    reply = (await call(server, "POST", COMPLETIONS, completion(seed=5, **fields))).json()
    return reply["choices"][0]["text"], reply["usage"]["completion_tokens"]


def test_a_stop_string_across_tokens_counts_every_token_that_spelled_it() -> None:
    async def check(server: SimServer) -> None:
        text, _ = await answer_text(server, max_tokens=40)
        words = text.split(" ")
        stop = f"{words[3][1:]} {words[4]} {words[5][:1]}"  # ends inside the 6th token
        cut, tokens = await answer_text(server, max_tokens=40, stop=stop)
        assert cut == text[: text.index(stop)]
        assert tokens == 6

    run(check)


def test_min_tokens_holds_back_the_end_and_the_stop_strings() -> None:
    async def check(server: SimServer) -> None:
        _, natural = await answer_text(server, max_tokens=1000)
        _, tokens = await answer_text(server, max_tokens=1000, min_tokens=natural + 50)
        assert tokens >= natural + 50  # no end of sequence before min_tokens
        text, _ = await answer_text(server, max_tokens=40, ignore_eos=True)
        words = text.split(" ")
        stop = f"{words[1]} {words[2]}"  # completed by the 3rd token
        cut, tokens = await answer_text(server, max_tokens=40, ignore_eos=True, stop=stop)
        assert tokens == 3 and cut == text[: text.index(stop)]
        late, tokens = await answer_text(
            server, max_tokens=40, ignore_eos=True, stop=stop, min_tokens=5
        )
        # not checked within the first 5 tokens: a later occurrence or none ends the answer
        assert tokens > 5 and late.startswith(" ".join(words[:5]))

    run(check)


def test_include_stop_str_in_output_keeps_the_stop_string() -> None:
    async def check(server: SimServer) -> None:
        text, _ = await answer_text(server, max_tokens=40)
        words = text.split(" ")
        stop = f"{words[2]} {words[3][:2]}"
        kept, tokens = await answer_text(
            server, max_tokens=40, stop=[stop], include_stop_str_in_output=True
        )
        assert kept == text[: text.index(stop) + len(stop)] and tokens == 4
        body = completion(seed=5, max_tokens=40, stop=stop, include_stop_str_in_output=True)
        events = (await call(server, "POST", COMPLETIONS, {**body, "stream": True})).events()
        assert "".join(e["choices"][0]["text"] for e in events) == kept

    run(check)


# -- refusals ----------------------------------------------------------------------------------
@pytest.mark.parametrize("prompt", ["", [[]], [], ["a", ""]])
def test_an_empty_prompt_is_a_400(prompt: Any) -> None:
    async def check(server: SimServer) -> None:
        error = assert_vllm_400(await call(server, "POST", COMPLETIONS, completion(prompt=prompt)))
        if prompt in ("", ["a", ""]):  # vLLM's renderer refuses empty text, naming the field
            assert (
                error["param"] == "prompt"
                and "must be provided and non-empty" in (error["message"])
            )
        elif prompt == [[]]:  # its input processor refuses a prompt of no tokens
            assert error["message"] == "The decoder prompt cannot be empty"

    run(check)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_min_tokens_above_max_tokens_is_a_400(path: str) -> None:
    async def check(server: SimServer) -> None:
        body = {"max_tokens": 3, "min_tokens": 5}
        request = chat(**body) if path == CHAT else completion(**body)
        error = assert_vllm_400(await call(server, "POST", path, request))
        assert error["message"] == "min_tokens must be less than or equal to max_tokens=3, got 5."
        fits = chat(**{**body, "min_tokens": 3}) if path == CHAT else completion(min_tokens=3)
        assert (await call(server, "POST", path, fits)).status == 200
        typed = chat(min_tokens="5") if path == CHAT else completion(min_tokens="5")
        assert assert_vllm_400(await call(server, "POST", path, typed))["param"] == "min_tokens"

    run(check)


def test_max_tokens_past_the_context_left_is_cut_to_it_and_above_max_model_len_refused() -> None:
    """vLLM 0.32 (get_max_tokens) cuts a max_tokens the prompt leaves too little room for to
    the rest of the context, so the answer ends at "length" there; only a max_tokens above
    max_model_len itself is its 400. Completions' default of 16 is cut the same way."""

    async def check(server: SimServer) -> None:
        max_model_len = server.config.max_model_len
        prompt = "word " * (max_model_len - 5)  # 5 tokens of context left
        for fields in ({"max_tokens": 10}, {}):
            reply = await call(
                server, "POST", COMPLETIONS, completion(prompt=prompt, ignore_eos=True, **fields)
            )
            assert reply.status == 200, reply.body
            answer = reply.json()
            assert answer["usage"]["completion_tokens"] == 5
            assert answer["choices"][0]["finish_reason"] == "length"
        # max_model_len itself is no more than max_model_len: cut, not refused.
        assert (await call(server, "POST", CHAT, chat(max_tokens=max_model_len))).status == 200
        error = assert_vllm_400(
            await call(server, "POST", CHAT, chat(max_tokens=max_model_len + 1))
        )
        assert error["param"] == "max_tokens"
        assert error["message"].startswith(
            f"max_tokens={max_model_len + 1} cannot be greater than max_model_len={max_model_len}."
        )

    run(check)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
def test_more_logprobs_than_the_engines_max_is_its_400(path: str) -> None:
    """The upper bound is vLLM's --max-logprobs (20 by default; -1 asks for the whole
    vocabulary), checked by the engine, not by the request schema."""

    def body(top: int) -> dict[str, Any]:
        return chat(logprobs=True, top_logprobs=top) if path == CHAT else completion(logprobs=top)

    async def check(server: SimServer) -> None:
        assert (await call(server, "POST", path, body(20))).status == 200
        error = assert_vllm_400(await call(server, "POST", path, body(21)))
        assert (
            error["message"]
            == "Requested sample logprobs of 21, which is greater than max allowed: 20"
        )
        assert error["param"] == "logprobs"
        whole = assert_vllm_400(await call(server, "POST", path, body(-1)))
        assert whole["message"].startswith("Requested sample logprobs of 50000,")

    run(check)


@pytest.mark.parametrize(
    ("prompt", "message"),
    [
        ([5, 50_000], "Token id 50000 is out of vocabulary"),
        ([[1, 2], [3, 70_000]], "Token id 70000 is out of vocabulary"),
        ([-1], "Invalid value for 'prompt.0': Input should be greater than or equal to 0."),
        (
            [[1], [3, -7]],
            "Invalid value for 'prompt.1.1': Input should be greater than or equal to 0.",
        ),
    ],
)
def test_a_token_id_out_of_the_vocabulary_is_a_400(prompt: list[Any], message: str) -> None:
    async def check(server: SimServer) -> None:
        error = assert_vllm_400(await call(server, "POST", COMPLETIONS, completion(prompt=prompt)))
        assert error["message"] == message
        fits = completion(prompt=[0, 49_999])
        assert (await call(server, "POST", COMPLETIONS, fits)).status == 200

    run(check)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(
    "response_format",
    [
        {"type": "xml"},
        {},
        "json",
        {"type": "json_schema"},  # vLLM's validate_response_format
        {"type": "json_schema", "json_schema": {"schema": {}}},  # its name is required
    ],
)
def test_a_response_format_vllm_has_no_model_for_is_a_400(path: str, response_format: Any) -> None:
    async def check(server: SimServer) -> None:
        make = chat if path == CHAT else completion
        body = make(response_format=response_format)
        param = assert_vllm_400(await call(server, "POST", path, body))["param"]
        assert param.startswith("response_format")
        for valid in ({"type": "text"}, {"type": "json_schema", "json_schema": {"name": "a"}}):
            assert (await call(server, "POST", path, make(response_format=valid))).status == 200

    run(check)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"top_p": 0}, "top_p must be in (0, 1], got 0."),
        ({"top_k": -5}, "top_k must be 0 (disable), or at least 1, got -5."),
        ({"top_k": 1.5}, "Invalid value for 'top_k': Input should be a valid integer."),
        ({"min_p": 2}, "min_p must be in [0, 1], got 2."),
        ({"repetition_penalty": 0}, "repetition_penalty must be greater than zero, got 0."),
    ],
)
def test_sampling_values_vllms_sampling_params_refuse_are_a_400(
    path: str, fields: dict[str, Any], message: str
) -> None:
    """The gateway passes these fields through; vLLM's SamplingParams checks them."""

    async def check(server: SimServer) -> None:
        make = chat if path == CHAT else completion
        error = assert_vllm_400(await call(server, "POST", path, make(max_tokens=2, **fields)))
        assert error["message"] == message
        fine = {"top_p": 0.5, "top_k": -1, "min_p": 0.0, "repetition_penalty": 1.2}
        assert (await call(server, "POST", path, make(max_tokens=2, **fine))).status == 200

    run(check)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"prompt_logprobs": 1, "stream": True}, "are not available when `stream=True`"),
        ({"prompt_logprobs": -1, "stream": True}, "are not available when `stream=True`"),
        ({"prompt_logprobs": -2}, "must be a positive value or -1"),
        ({"prompt_logprobs": "1"}, "must be an integer"),
        ({"prompt_logprobs": 1.5}, "must be an integer"),
        ({"prompt_logprobs": -0.5}, "must be an integer"),
        ({"prompt_logprobs": 21}, "Requested prompt logprobs of 21, which is greater than"),
    ],
)
def test_prompt_logprobs_vllm_refuses_are_a_400(
    path: str, fields: dict[str, Any], message: str
) -> None:
    async def check(server: SimServer) -> None:
        make = chat if path == CHAT else completion
        error = assert_vllm_400(await call(server, "POST", path, make(max_tokens=2, **fields)))
        assert error["param"] == "prompt_logprobs" and message in error["message"], error
        fine = make(max_tokens=2, prompt_logprobs=0, stream=True)  # 0 asks for none
        assert (await call(server, "POST", path, fine)).status == 200

    run(check)


def test_continue_final_message_needs_add_generation_prompt_off() -> None:
    """vLLM's check_generation_prompt: add_generation_prompt defaults to true."""

    async def check(server: SimServer) -> None:
        error = assert_vllm_400(await call(server, "POST", CHAT, chat(continue_final_message=True)))
        assert "Cannot set both `continue_final_message`" in error["message"]
        off = chat(continue_final_message=True, add_generation_prompt=False)
        assert (await call(server, "POST", CHAT, off)).status == 200

    run(check)


@pytest.mark.parametrize("temperature", [0, 1e-6])
def test_n_choices_under_greedy_sampling_are_a_400(temperature: float) -> None:
    async def check(server: SimServer) -> None:
        body = chat(n=2, temperature=temperature)
        assert "greedy" in assert_vllm_400(await call(server, "POST", CHAT, body))["message"]

    run(check)


@pytest.mark.parametrize("path", [CHAT, COMPLETIONS])
@pytest.mark.parametrize("stop", ["", ["never there", ""]])
def test_an_empty_stop_string_is_a_400(path: str, stop: Any) -> None:
    async def check(server: SimServer) -> None:
        body = chat(stop=stop) if path == CHAT else completion(stop=stop)
        error = assert_vllm_400(await call(server, "POST", path, body))
        assert error["message"] == "stop cannot contain an empty string."

    run(check)


@pytest.mark.parametrize(
    "body",
    [
        {"messages": [1]},
        {"messages": "hello"},
        {"messages": [{"role": "user", "tool_calls": [{"function": 5}]}]},
        {"messages": [{"content": "no role"}]},
        {"prompt": 5},
        {},
        [1],
        b"{not json",
    ],
)
def test_a_malformed_tokenize_body_is_a_400(body: Any) -> None:
    async def check(server: SimServer) -> None:
        assert_vllm_400(await call(server, "POST", "/tokenize", body))

    run(check)


def test_tokenize_counts_a_chat_and_a_prompt() -> None:
    async def check(server: SimServer) -> None:
        messages = {"messages": [{"role": "user", "content": "hi there"}]}
        assert (await call(server, "POST", "/tokenize", messages)).json()["count"] > 2
        prompt = (await call(server, "POST", "/tokenize", {"prompt": "hi there"})).json()
        assert prompt["count"] == 2

    run(check)


@pytest.mark.parametrize(
    ("method", "path", "status", "detail"),
    [
        ("GET", "/v2/nothing", 404, "Not Found"),
        ("GET", CHAT, 405, "Method Not Allowed"),
        ("POST", "/v1/models", 405, "Method Not Allowed"),
    ],
)
def test_an_unrouted_request_gets_fastapis_answer_as_from_vllm(
    method: str, path: str, status: int, detail: str
) -> None:
    """vLLM's handlers catch fastapi's HTTPException, not the Starlette one its router raises
    for a path it does not serve: the answer is FastAPI's bare `detail` (the simulator
    answered every such request with an OpenAI-shaped 404)."""

    async def check(server: SimServer) -> None:
        reply = await call(server, method, path)
        assert (reply.status, reply.json()) == (status, {"detail": detail})

    run(check)


def test_an_unknown_model_is_vllms_404_naming_the_served_one() -> None:
    async def check(server: SimServer) -> None:
        reply = await call(server, "POST", COMPLETIONS, completion(model="other"))
        assert reply.status == 404
        assert reply.json() == {
            "error": {
                "message": "The model `other` does not exist. Valid aliases: sim-test.",
                "type": "NotFoundError",
                "param": "model",
                "code": 404,
            }
        }

    run(check)


def test_a_model_card_has_the_fields_of_vllms() -> None:
    """vLLM's ModelCard and ModelPermission (serve/engine/protocol.py); the simulator's card
    had no parent and no permission."""

    async def check(server: SimServer) -> None:
        (card,) = (await call(server, "GET", "/v1/models")).json()["data"]
        assert set(card) == {
            *("id", "object", "created", "owned_by", "root", "parent"),
            *("max_model_len", "permission"),
        }
        assert card["parent"] is None and card["max_model_len"] == server.config.max_model_len
        (permission,) = card["permission"]
        assert permission["object"] == "model_permission"
        assert permission["id"].startswith("modelperm-") and permission["organization"] == "*"
        assert permission["allow_sampling"] and not permission["allow_fine_tuning"]

    run(check)


@pytest.mark.parametrize("prompt", [" ", " \n\t "])
def test_a_prompt_of_only_whitespace_counts_one_token(prompt: str) -> None:
    """A real tokenizer spells whitespace with tokens; the simulator counted none, so such a
    prompt was served, and billed in usage, as a prompt of 0 tokens."""

    async def check(server: SimServer) -> None:
        tokenized = (await call(server, "POST", "/tokenize", {"prompt": prompt})).json()
        assert tokenized["count"] == 1
        reply = await call(server, "POST", COMPLETIONS, completion(prompt=prompt, max_tokens=2))
        assert reply.status == 200 and reply.json()["usage"]["prompt_tokens"] == 1

    run(check)


# -- metrics -----------------------------------------------------------------------------------
def test_request_success_has_vllms_reasons_and_counts_each_choice() -> None:
    async def check(server: SimServer) -> None:
        text = (await call(server, "GET", "/metrics")).body.decode()
        reasons = [
            line.split('finished_reason="')[1].split('"')[0]
            for line in text.splitlines()
            if line.startswith("vllm:request_success_total")
        ]
        assert reasons == list(FINISHED_REASONS)
        await call(server, "POST", CHAT, chat(tools=TOOLS, n=2, seed=1))  # tool calls: "stop"
        await call(server, "POST", COMPLETIONS, completion(n=3, max_tokens=2, ignore_eos=True))
        assert success(server, "stop") == 2 and success(server, "length") == 3
        assert "tool_calls" not in (await call(server, "GET", "/metrics")).body.decode()
        e2e = 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="sim-test"}'
        ttft = 'vllm:time_to_first_token_seconds_count{engine="0",model_name="sim-test"}'
        assert metric(server, e2e) == 5 and metric(server, ttft) == 5  # one per choice

    run(check)


def test_tokens_per_finished_request_are_histograms_as_vllms() -> None:
    """request_prompt_tokens and request_generation_tokens: observed once per finished
    choice, with its prompt and its output length, on vLLM's 1-2-5 buckets."""

    async def check(server: SimServer) -> None:
        labels = '{engine="0",model_name="sim-test"}'
        prompt = "count the ledger entries again"
        reply = await call(
            server,
            "POST",
            COMPLETIONS,
            completion(prompt=prompt, n=2, max_tokens=7, ignore_eos=True),
        )
        usage = reply.json()["usage"]
        assert metric(server, f"vllm:request_prompt_tokens_count{labels}") == 2
        assert (
            metric(server, f"vllm:request_prompt_tokens_sum{labels}") == 2 * usage["prompt_tokens"]
        )
        assert metric(server, f"vllm:request_generation_tokens_sum{labels}") == 14
        assert usage["completion_tokens"] == 14
        bucket = 'vllm:request_generation_tokens_bucket{engine="0",le="10.0",model_name="sim-test"}'
        assert metric(server, bucket) == 2
        assert metric(server, bucket.replace('le="10.0"', 'le="5.0"')) == 0
        # vLLM's bounds go up to max_model_len (build_1_2_5_buckets), here 32,768.
        assert server.config.max_model_len == 32_768
        assert metric(server, bucket.replace('le="10.0"', 'le="20000.0"')) == 2
        with pytest.raises(AssertionError, match="no sample"):
            metric(server, bucket.replace('le="10.0"', 'le="50000.0"'))

    run(check)


def test_latency_histograms_have_vllms_buckets() -> None:
    """Quantiles over the simulator's latencies read as over vLLM's: the same bounds."""

    async def check(server: SimServer) -> None:
        page = (await call(server, "GET", "/metrics")).body.decode()

        def bounds(name: str) -> list[float]:
            prefix = f"vllm:{name}_bucket{{"
            lines = [line for line in page.splitlines() if line.startswith(prefix)]
            return [float(line.split('le="')[1].split('"')[0]) for line in lines]

        assert bounds("e2e_request_latency_seconds")[:3] == [0.3, 0.5, 0.8]
        assert bounds("e2e_request_latency_seconds")[-2:] == [7680.0, float("inf")]
        assert bounds("time_to_first_token_seconds")[:2] == [0.001, 0.005]
        assert bounds("time_to_first_token_seconds")[-2:] == [2560.0, float("inf")]

    run(check)


def test_a_dropped_stream_is_not_counted_as_finished() -> None:
    async def check(server: SimServer) -> None:
        server.faults = server.faults.model_copy(
            update={"drop_mid_stream": 1.0, "drop_after_chunks": 2}
        )
        body = orjson.dumps(completion(stream=True, max_tokens=50, ignore_eos=True))
        with pytest.raises(StreamDropped):
            await call(server, "POST", COMPLETIONS, body)
        assert all(success(server, reason) == 0 for reason in FINISHED_REASONS)
        e2e = 'vllm:e2e_request_latency_seconds_count{engine="0",model_name="sim-test"}'
        assert metric(server, e2e) == 0

    run(check)


def test_prefix_cache_counters_are_exported_at_zero_with_caching_off() -> None:
    """As vLLM: the counters exist without prefix caching, and are never counted."""

    async def check(server: SimServer) -> None:
        assert not server.engine.config.prefix_caching
        await call(server, "POST", COMPLETIONS, completion(max_tokens=2))
        labels = '{engine="0",model_name="sim-test"}'
        assert metric(server, f"vllm:prefix_cache_queries_total{labels}") == 0
        assert metric(server, f"vllm:prefix_cache_hits_total{labels}") == 0
        assert metric(server, f"vllm:prompt_tokens_total{labels}") > 0

    run(check)
