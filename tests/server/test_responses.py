"""The OpenAI Responses API (POST /v1/responses) through the `openai` Python package, whose typed models are the
acceptance test of the shapes: greedy output equal to /v1/chat/completions for the same conversation (text, items,
instructions, function_call / function_call_output history), max_output_tokens -> status "incomplete", the streamed
events (order, sequence numbers, deltas), reasoning items (Qwen3.8 template), and errors naming the Responses field.

The random-weight model never writes a tool call, so turning a parsed call into a function_call item (and the
"completed" status) is unit-tested in C++ (tests/engine/server_responses_test.cpp) with fabricated output.
"""

from __future__ import annotations

import json

import openai
import pytest
import requests
from openai.types import responses as rt

from conftest import Server

MAX = 12  # output tokens of each request: the random model never ends earlier, so every response is "incomplete"
PROMPT = "Tell me about flash attention."
TOOLS_CHAT = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                                "parameters": {"type": "object",
                                                               "properties": {"city": {"type": "string"}},
                                                               "required": ["city"]}}}]
TOOLS = [{"type": "function", **TOOLS_CHAT[0]["function"]}]  # Responses' flat form of the same tool


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


def chat(client, messages, **kw):
    """The greedy chat completion of `messages`: (reasoning, content, usage)."""
    r = client.chat.completions.create(model="tiny", messages=messages, temperature=0, max_tokens=MAX, **kw)
    m = r.choices[0].message
    return getattr(m, "reasoning_content", None) or "", m.content or "", r.usage


def respond(client, **kw):
    return client.responses.create(model="tiny", temperature=0, max_output_tokens=MAX, **kw)


def text_of(r, kind):
    """The texts of the output items of `kind` ("message" or "reasoning"), joined."""
    return "".join(c.text for item in r.output if item.type == kind for c in (item.content or []))


def assert_same_as_chat(r, reasoning, content, usage):
    assert text_of(r, "reasoning") == reasoning
    assert r.output_text == content
    assert r.usage.input_tokens == usage.prompt_tokens
    assert r.usage.output_tokens == usage.completion_tokens == MAX
    assert r.usage.total_tokens == usage.total_tokens


def test_text_matches_chat_and_max_output_tokens_is_incomplete(client):
    r = respond(client, input=PROMPT)
    assert isinstance(r, rt.Response)
    assert r.object == "response" and r.id.startswith("resp_") and r.model == "tiny"
    assert_same_as_chat(r, *chat(client, [{"role": "user", "content": PROMPT}]))
    assert r.status == "incomplete" and r.incomplete_details.reason == "max_output_tokens"
    message = [item for item in r.output if item.type == "message"]
    assert len(message) == 1 and isinstance(message[0], rt.ResponseOutputMessage)
    assert message[0].id.startswith("msg_") and message[0].role == "assistant"
    assert message[0].content[0].type == "output_text" and message[0].content[0].annotations == []
    # The settings the request ran with are echoed back.
    assert r.max_output_tokens == MAX and r.temperature == 0 and r.tools == [] and r.tool_choice == "auto"
    assert r.parallel_tool_calls is True and r.error is None and r.previous_response_id is None
    assert r.usage.input_tokens_details.cached_tokens == 0


def test_instructions_and_items_match_chat(client):
    items = [{"role": "developer", "content": "Answer in French."},
             {"role": "user", "content": [{"type": "input_text", "text": "Hello"}, {"type": "input_text", "text": "there"}]},
             {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Bonjour."}]},
             {"role": "user", "content": PROMPT}]
    r = respond(client, instructions="You are terse.", input=items, metadata={"k": "v"}, store=True, user="u1")
    messages = [{"role": "system", "content": "You are terse."},
                {"role": "developer", "content": "Answer in French."},
                {"role": "user", "content": "Hello\nthere"},
                {"role": "assistant", "content": "Bonjour."},
                {"role": "user", "content": PROMPT}]
    assert_same_as_chat(r, *chat(client, messages))
    assert r.instructions == "You are terse." and r.metadata == {"k": "v"} and r.user == "u1"


def test_function_call_history_matches_chat(client):
    items = [{"role": "user", "content": "Weather in Paris?"},
             {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": '{"city": "Paris"}'},
             {"type": "function_call_output", "call_id": "call_1", "output": "sunny, 21 C"}]
    r = respond(client, input=items, tools=TOOLS)
    messages = [{"role": "user", "content": "Weather in Paris?"},
                {"role": "assistant", "content": None, "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"}]
    assert_same_as_chat(r, *chat(client, messages, tools=TOOLS_CHAT))
    assert not [item for item in r.output if item.type == "function_call"]  # random weights: no call markup
    assert len(r.tools) == 1 and r.tools[0].type == "function" and r.tools[0].name == "get_weather"
    # The same with tool_choice "none": the tools are rendered, calls are not parsed.
    r2 = respond(client, input=items, tools=TOOLS, tool_choice="none")
    assert r2.output_text == r.output_text and r2.tool_choice == "none"


def test_streaming_events(client, server):
    full = respond(client, input=PROMPT)
    events = list(respond(client, input=PROMPT, stream=True))
    types = [e.type for e in events]
    assert [e.sequence_number for e in events] == list(range(len(events)))
    assert types[:2] == ["response.created", "response.in_progress"]
    assert types[-1] == "response.incomplete"
    assert events[0].response.status == "in_progress" and events[0].response.output == []
    assert len({e.response.id for e in events if hasattr(e, "response")}) == 1
    # Every event parsed into its typed model (an unknown type or shape would not).
    kinds = {"response.created": rt.ResponseCreatedEvent, "response.in_progress": rt.ResponseInProgressEvent,
             "response.output_item.added": rt.ResponseOutputItemAddedEvent,
             "response.output_item.done": rt.ResponseOutputItemDoneEvent,
             "response.content_part.added": rt.ResponseContentPartAddedEvent,
             "response.content_part.done": rt.ResponseContentPartDoneEvent,
             "response.output_text.delta": rt.ResponseTextDeltaEvent,
             "response.output_text.done": rt.ResponseTextDoneEvent,
             "response.reasoning_text.delta": rt.ResponseReasoningTextDeltaEvent,
             "response.reasoning_text.done": rt.ResponseReasoningTextDoneEvent,
             "response.incomplete": rt.ResponseIncompleteEvent}
    for e in events:
        assert isinstance(e, kinds[e.type]), e
    # Each item: added, [part added, deltas, text done, part done], done -- and the deltas make the final text.
    final = events[-1].response
    assert final.status == "incomplete" and final.incomplete_details.reason == "max_output_tokens"
    assert final.output_text == full.output_text
    assert text_of(final, "reasoning") == text_of(full, "reasoning")
    assert final.usage.model_dump() == full.usage.model_dump()
    for index, item in enumerate(final.output):
        mine = [e for e in events if getattr(e, "output_index", None) == index]
        kind = "reasoning_text" if item.type == "reasoning" else "output_text"
        assert [e.type for e in mine if not e.type.endswith(".delta")] == [
            "response.output_item.added", "response.content_part.added", f"response.{kind}.done",
            "response.content_part.done", "response.output_item.done"]
        assert mine[0].item.id == item.id and mine[-1].item.model_dump() == item.model_dump()
        deltas = "".join(e.delta for e in mine if e.type.endswith(".delta"))
        done = [e for e in mine if e.type == f"response.{kind}.done"][0]
        assert deltas == item.content[0].text == done.text
        assert all(e.item_id == item.id for e in mine[1:-1])

    # On the wire: `event:` lines naming each data's type, and no [DONE] (the Responses API sends none).
    raw = requests.post(server.v1 + "/responses", json={"model": "tiny", "input": PROMPT, "stream": True,
                                                        "temperature": 0, "max_output_tokens": 3}, timeout=60)
    assert raw.status_code == 200 and raw.headers["Content-Type"].startswith("text/event-stream")
    blocks = [b for b in raw.text.split("\n\n") if b.strip()]
    assert "[DONE]" not in raw.text
    for block in blocks:
        event_line, data_line = block.split("\n")
        assert event_line.startswith("event: ") and data_line.startswith("data: ")
        assert json.loads(data_line[6:])["type"] == event_line[7:]


def test_responses_stream_helper(client):
    if not hasattr(client.responses, "stream"):
        pytest.skip("this openai package has no client.responses.stream")
    full = respond(client, input=PROMPT)
    text, last = "", None
    with client.responses.stream(model="tiny", input=PROMPT, temperature=0, max_output_tokens=MAX) as stream:
        for event in stream:
            if event.type == "response.output_text.delta":
                text += event.delta
            last = event
    # An incomplete response ends with response.incomplete (get_final_response() wants response.completed).
    assert last.type == "response.incomplete"
    assert text == last.response.output_text == full.output_text


def test_reasoning_items_qwen38_template(qwen38_model_dir):
    """The Qwen3.8 generation prompt opens <think>: the output is reasoning (the random model never closes it)."""
    s = Server("--max-model-len", "2048", "--served-model-name", "tiny", model=qwen38_model_dir)
    try:
        client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0, timeout=120)
        messages = [{"role": "user", "content": PROMPT}]
        reasoning, content, usage = chat(client, messages)
        assert reasoning
        r = respond(client, input=messages)
        assert_same_as_chat(r, reasoning, content, usage)
        assert r.output[0].type == "reasoning" and r.output[0].id.startswith("rs_")
        assert isinstance(r.output[0], rt.ResponseReasoningItem) and r.output[0].summary == []
        assert r.output[-1].type == "message"  # there is always a final message (here maybe empty)
        assert 0 < r.usage.output_tokens_details.reasoning_tokens <= r.usage.output_tokens
        events = list(respond(client, input=messages, stream=True))
        assert "".join(e.delta for e in events if e.type == "response.reasoning_text.delta") == reasoning
        assert [e.text for e in events if e.type == "response.reasoning_text.done"] == [reasoning]
        assert events[-1].response.output[0].content[0].text == reasoning
        # A reasoning item of the history becomes reasoning_content of the assistant turn after it.
        history = [{"role": "user", "content": "Weather?"},
                   {"type": "reasoning", "id": "rs_1", "summary": [],
                    "content": [{"type": "reasoning_text", "text": "I should ask."}]},
                   {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "Where?"}]},
                   {"role": "user", "content": "Paris"}]
        r = respond(client, input=history, reasoning={"effort": "low"})
        chat_history = [{"role": "user", "content": "Weather?"},
                        {"role": "assistant", "content": "Where?", "reasoning_content": "I should ask."},
                        {"role": "user", "content": "Paris"}]
        assert_same_as_chat(r, *chat(client, chat_history, reasoning_effort="low"))
        assert r.reasoning.effort == "low"
    finally:
        s.stop()


def error_of(server, body):
    r = requests.post(server.v1 + "/responses", json={"model": "tiny", **body}, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["type"] == "invalid_request_error" and err["code"] == 400 and len(err["message"]) < 400
    return err


@pytest.mark.parametrize("body,param,needle", [
    ({"input": [{"role": "user", "content": "a"},
                {"role": "user", "content": [{"type": "input_text", "text": "b"}, {"type": "input_image", "image_url": "x"}]}]},
     "input[1].content[1].type", "input_image"),
    ({"input": "hi", "previous_response_id": "resp_1"}, "previous_response_id",
     "not supported: the server stores no responses"),
    ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type", "web_search"),
    ({"input": [{"type": "computer_call", "id": "x"}]}, "input[0].type", "computer_call"),
    ({"input": "hi", "max_output_tokens": 0}, "max_output_tokens", "max_output_tokens must be >= 1"),
    ({"input": "hi", "max_output_tokens": 5000}, "max_output_tokens", "maximum context length"),
    ({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": "{no"}]},
     "input[0].arguments", "not valid JSON"),
    ({"input": "hi", "temperature": -1}, "temperature", "temperature"),
    ({"input": []}, "input", "must not be empty"),
])
def test_errors_name_the_responses_field(server, client, body, param, needle):
    err = error_of(server, body)
    assert err["param"] == param and needle in err["message"], err
    with pytest.raises(openai.BadRequestError) as e:  # ... which the client raises as such
        client.responses.create(model=body.get("model", "tiny"),
                                extra_body={k: v for k, v in body.items() if k != "model"})
    assert e.value.param == param


def test_an_unknown_model_is_not_found(server, client):
    # 404, as OpenAI (model_not_found) and vLLM (NotFoundError) answer it; the client raises NotFoundError.
    r = requests.post(server.v1 + "/responses", json={"model": "gpt-9", "input": "hi"}, timeout=30)
    assert r.status_code == 404, r.text
    err = r.json()["error"]
    assert err["type"] == "not_found_error" and err["param"] == "model" and "does not exist" in err["message"], err
    with pytest.raises(openai.NotFoundError):
        client.responses.create(model="gpt-9", input="hi")


def test_unknown_fields_are_ignored_as_in_chat(server):
    # As the chat endpoint under the default (lenient) policy: the unknown field is ignored, the output unchanged.
    body = {"model": "tiny", "input": "hi", "max_output_tokens": 6, "temperature": 0}
    plain = requests.post(server.url + "/v1/responses", json=body, timeout=60)
    extra = requests.post(server.url + "/v1/responses", json={**body, "frobnicate": True,
                                                               "text": {"format": {"type": "text"}, "shade": 1}},
                          timeout=60)
    assert plain.status_code == 200 and extra.status_code == 200, extra.text
    def texts(r):
        return [(i["type"], i.get("content")) for i in r.json()["output"]]  # item ids are random
    assert texts(extra) == texts(plain) and texts(plain)



def test_options_the_chat_path_decides(server):
    """text.format json_schema and tool_choice "required" / named are passed to the chat parser as response_format
    and tool_choice; whether it supports them is its decision, but an error names the Responses field."""
    fmt = {"type": "json_schema", "name": "city", "schema": {"type": "object", "properties": {"c": {"type": "string"}}}}
    cases = [({"text": {"format": fmt}}, "text.format"),
             ({"tools": TOOLS, "tool_choice": "required"}, "tool_choice"),
             ({"tools": TOOLS, "tool_choice": {"type": "function", "name": "get_weather"}}, "tool_choice")]
    for extra, param in cases:
        r = requests.post(server.v1 + "/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 4,
                                                          **extra}, timeout=60)
        if r.status_code == 400:
            assert r.json()["error"]["param"].startswith(param), r.text
        else:
            assert r.status_code == 200, r.text
            assert r.json()["object"] == "response"


def test_hostile_fields_and_metrics(server):
    """Every field nested to the JSON depth limit gets a short 400, past it the parser's 400; huge values are quoted
    as excerpts only; finished requests are counted under endpoint="responses"."""
    def greedy():
        r = requests.post(server.v1 + "/responses", timeout=30,
                          json={"model": "tiny", "input": "the same words", "max_output_tokens": 16, "temperature": 0})
        assert r.status_code == 200, r.text
        # the texts of the output items (their ids differ from response to response)
        return [[c.get("text") for c in item.get("content") or []] for item in r.json()["output"]]

    before = greedy()
    fields = ["model", "input", "instructions", "tools", "tool_choice", "max_output_tokens", "temperature", "top_p",
              "text", "reasoning", "stream", "stream_options", "store", "previous_response_id", "conversation",
              "metadata", "user", "parallel_tool_calls", "truncation", "include", "top_logprobs", "max_tool_calls",
              "background", "service_tier", "prompt", "prompt_cache_key", "safety_identifier"]
    for field in fields:
        base = {k: v for k, v in {"model": "tiny", "input": "hi", "max_output_tokens": 1}.items() if k != field}
        for depth, needle in ((63, None), (64, "deeper than 64 levels")):
            text = json.dumps(base)[:-1] + f', "{field}": ' + "[" * depth + "]" * depth + "}"
            r = requests.post(server.v1 + "/responses", data=text, headers={"Content-Type": "application/json"},
                              timeout=30)
            assert r.status_code == 400, (field, depth, r.text)
            assert r.json()["error"]["type"] == "invalid_request_error", (field, depth, r.text)
            assert len(r.json()["error"]["message"]) < 400
            if needle:
                assert needle in r.json()["error"]["message"]
    big = "z" * 300_000
    for body in ({"input": [{"role": big, "content": "x"}]}, {"input": [{"type": big}]},
                 {"input": "hi", "tools": [{"type": big}]}):
        r = requests.post(server.v1 + "/responses", json={"model": "tiny", **body}, timeout=30)
        assert r.status_code == 400 and len(r.content) < 1000
        assert r.json()["error"]["type"] == "invalid_request_error"
    assert requests.get(server.url + "/health", timeout=5).status_code == 200
    assert greedy() == before  # the same output as before the attack
    # A huge unknown field name is ignored (lenient policy); its log line quotes a clipped name.
    r = requests.post(server.v1 + "/responses", json={"model": "tiny", "input": "hi", "max_output_tokens": 1, big: 1},
                      timeout=30)
    assert r.status_code == 200, r.text[:300]
    assert not any(big[:200] in line for line in server.log)
    requests.post(server.v1 + "/responses", json={"model": "tiny", "input": "count me", "max_output_tokens": 2},
                  timeout=30).raise_for_status()
    m = server.wait_idle()
    assert m['flashnext_requests_total{endpoint="responses",finish_reason="length"}'] >= 1
