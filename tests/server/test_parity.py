"""vLLM parity of `flashnext serve` (issue 17) through the `openai` client and the bundled random-weight model:
structured output (response_format json_object / json_schema, tool_choice required / named), n > 1, logit_bias,
min_tokens, echo with prompt log-probabilities (max_tokens 0, as lm-eval-harness sends it), vLLM's prompt_logprobs,
batched prompts and the priority policy. Every expected value comes from the JSON Schema, from the request, or from
single requests to the same server (seed + i for choice i, raw log-probabilities of a forced token)."""

from __future__ import annotations

import json
import math

import jsonschema
import openai
import pytest
import requests

from conftest import Server

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "kind": {"enum": ["cat", "dog", "fish"]},
        "age": {"type": "integer", "minimum": 0},
        "tags": {"type": "array", "items": {"type": "string", "enum": ["a", "b", "c"]}, "maxItems": 3},
        "owner": {"type": "object", "properties": {"id": {"type": "integer"}, "verified": {"type": "boolean"}},
                  "required": ["id", "verified"]},
    },
    "required": ["name", "kind", "age", "tags", "owner"],
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather of a city", "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "enum": ["Paris", "Oslo", "Lima"]},
                       "days": {"type": "integer", "minimum": 1, "maximum": 99},
                       "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city", "days"]}}},
    {"type": "function", "function": {"name": "now", "description": "The time", "parameters": {"type": "object",
                                                                                             "properties": {}}}},
]
MESSAGES = [{"role": "user", "content": "Describe a pet as JSON."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=300)


def token_ids(server, text: str) -> list[int]:
    r = requests.post(server.url + "/tokenize", json={"prompt": text}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def test_json_schema_output_validates_for_20_seeds_at_temperature_1(client):
    fmt = {"type": "json_schema", "json_schema": {"name": "pet", "schema": SCHEMA, "strict": True}}
    for seed in range(20):
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=1.0, seed=seed,
                                           max_tokens=400, response_format=fmt)
        c = r.choices[0]
        assert c.finish_reason == "stop", (seed, c.message.content)
        jsonschema.validate(json.loads(c.message.content), SCHEMA)


def test_json_object_output_is_an_object(client):
    for seed in range(5):
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=1.0, seed=seed,
                                           max_tokens=300, response_format={"type": "json_object"},
                                           extra_body={"top_k": 40})
        if r.choices[0].finish_reason == "stop":
            assert isinstance(json.loads(r.choices[0].message.content), dict)
        else:  # an object whose free-form strings ran past max_tokens: a prefix of one
            assert r.choices[0].finish_reason == "length" and r.choices[0].message.content.startswith("{")


def test_unsupported_schema_features_get_a_400_naming_them(server):
    body = {"model": "tiny", "messages": MESSAGES, "max_tokens": 5,
            "response_format": {"type": "json_schema",
                                "json_schema": {"name": "x", "schema": {"type": "string", "pattern": "a+"}}}}
    r = requests.post(server.url + "/v1/chat/completions", json=body, timeout=30)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert "pattern" in err["message"] and err["param"] == "response_format.json_schema.schema", err


def check_calls(calls, allowed: set[str]):
    by_name = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    assert calls
    for call in calls:
        assert call.function.name in allowed
        jsonschema.validate(json.loads(call.function.arguments), by_name[call.function.name])


def test_tool_choice_required_returns_valid_calls(client):
    for parallel in (False, True):
        for seed in range(8):
            r = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Weather?"}],
                                               tools=TOOLS, tool_choice="required", temperature=1.0, seed=seed,
                                               max_tokens=700, parallel_tool_calls=parallel)
            c = r.choices[0]
            assert c.finish_reason == "tool_calls", (seed, c.message)
            check_calls(c.message.tool_calls, {"get_weather", "now"})
            if not parallel:
                assert len(c.message.tool_calls) == 1


def test_tool_choice_naming_a_function_returns_one_call_of_it(client):
    for seed in range(8):
        r = client.chat.completions.create(
            model="tiny", messages=[{"role": "user", "content": "Weather in Oslo?"}], tools=TOOLS,
            tool_choice={"type": "function", "function": {"name": "get_weather"}}, temperature=1.0, seed=seed,
            max_tokens=300)
        c = r.choices[0]
        assert c.finish_reason == "tool_calls", (seed, c.message)
        assert len(c.message.tool_calls) == 1
        check_calls(c.message.tool_calls, {"get_weather"})


def test_n_choices_equal_single_requests_seeded_seed_plus_i(client):
    kw = dict(model="tiny", messages=MESSAGES, temperature=1.0, max_tokens=12)
    r = client.chat.completions.create(n=3, seed=40, **kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    texts = [c.message.content for c in r.choices]
    for i in range(3):
        single = client.chat.completions.create(n=1, seed=40 + i, **kw)
        assert single.choices[0].message.content == texts[i]
        assert r.usage.prompt_tokens == single.usage.prompt_tokens  # the prompt counts once
    assert len(set(texts)) == 3
    assert r.usage.completion_tokens == 36
    # Streamed: the deltas of each index add up to the same texts.
    parts = ["", "", ""]
    finished = set()
    for chunk in client.chat.completions.create(n=3, seed=40, stream=True, **kw):
        for c in chunk.choices:
            parts[c.index] += c.delta.content or ""
            if c.finish_reason:
                finished.add(c.index)
    assert parts == texts and finished == {0, 1, 2}


def test_logit_bias_plus_100_forces_the_token(server, client):
    tok = token_ids(server, " the")[0]
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=1.0, seed=3,
                                  logit_bias={str(tok): 100}, logprobs=0,
                                  extra_body={"return_tokens_as_token_ids": True})
    assert r.choices[0].logprobs.tokens == [f"token_id:{tok}"] * 6
    r = client.completions.create(model="tiny", prompt="Once upon a time", max_tokens=6, temperature=0,
                                  logit_bias={str(tok): -100}, logprobs=0,
                                  extra_body={"return_tokens_as_token_ids": True})
    assert f"token_id:{tok}" not in r.choices[0].logprobs.tokens


def test_min_tokens_holds_eos_back_until_reached(server, client):
    eos = token_ids(server, "<|im_end|>")  # generation_config.json eos_token_id
    assert len(eos) == 1
    bias = {str(eos[0]): 100}  # EOS would come first
    r = client.completions.create(model="tiny", prompt="Hello", max_tokens=20, temperature=0, logit_bias=bias)
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 1
    r = client.completions.create(model="tiny", prompt="Hello", max_tokens=20, temperature=0, logit_bias=bias,
                                  extra_body={"min_tokens": 5})
    assert r.choices[0].finish_reason == "stop" and r.usage.completion_tokens == 6


def test_echo_with_logprobs_scores_the_prompt_like_forced_decoding(server, client):
    prompt = "The capital of France is Paris"
    ids = token_ids(server, prompt)
    r = client.completions.create(model="tiny", prompt=prompt, max_tokens=0, echo=True, logprobs=1,
                                  extra_body={"return_tokens_as_token_ids": True})
    c = r.choices[0]
    assert c.text == prompt and r.usage.completion_tokens == 0
    assert c.logprobs.tokens == [f"token_id:{t}" for t in ids]
    assert c.logprobs.token_logprobs[0] is None and c.logprobs.top_logprobs[0] is None
    for i in range(1, len(ids)):
        # The same log-probability through decoding: the raw logprob of the prompt token forced by logit_bias.
        forced = client.completions.create(model="tiny", prompt=ids[:i], max_tokens=1, temperature=0, logprobs=0,
                                           logit_bias={str(ids[i]): 100})
        assert math.isclose(c.logprobs.token_logprobs[i], forced.choices[0].logprobs.token_logprobs[0],
                            abs_tol=1e-4), i
        assert c.logprobs.token_logprobs[i] <= 0
    # vLLM's prompt_logprobs (without echo): the same numbers keyed by token id.
    body = {"model": "tiny", "prompt": prompt, "max_tokens": 1, "temperature": 0, "prompt_logprobs": 2}
    p = requests.post(server.url + "/v1/completions", json=body, timeout=60).json()["choices"][0]["prompt_logprobs"]
    assert p[0] is None and len(p) == len(ids)
    for i in range(1, len(ids)):
        entry = p[i][str(ids[i])]
        assert math.isclose(entry["logprob"], c.logprobs.token_logprobs[i], abs_tol=1e-6)
        assert len(p[i]) in (2, 3)  # the prompt token and the top 2 (it may be one of them)


def test_batched_prompts_get_n_choices_each_in_prompt_order(server, client):
    prompts = ["Good morning", "The weather today"]
    r = client.completions.create(model="tiny", prompt=prompts, n=2, max_tokens=6, temperature=0)
    assert [c.index for c in r.choices] == [0, 1, 2, 3]
    total_prompt = 0
    for k, p in enumerate(prompts):
        single = client.completions.create(model="tiny", prompt=p, max_tokens=6, temperature=0)
        assert r.choices[2 * k].text == single.choices[0].text == r.choices[2 * k + 1].text
        total_prompt += single.usage.prompt_tokens
    assert r.usage.prompt_tokens == total_prompt and r.usage.completion_tokens == 24


def test_priority_needs_the_priority_policy(server):
    body = {"model": "tiny", "prompt": "x", "max_tokens": 2, "temperature": 0, "priority": 3}
    r = requests.post(server.url + "/v1/completions", json=body, timeout=30)
    assert r.status_code == 400 and r.json()["error"]["param"] == "priority", r.text
    s = Server("--max-model-len", "256", "--served-model-name", "tiny", "--scheduling-policy", "priority")
    try:
        r = requests.post(s.url + "/v1/completions", json=body, timeout=30)
        assert r.status_code == 200, r.text
        plain = requests.post(s.url + "/v1/completions", json={**body, "priority": 0}, timeout=30)
        assert r.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    finally:
        s.stop()
