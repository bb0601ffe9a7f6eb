"""`flashnext serve` through the `openai` Python package as a real client: models, chat and completions (streaming
and not), usage, logprobs, the reasoning split, a tool-call round trip, /tokenize and /detokenize, /metrics."""

from __future__ import annotations

import math

import openai
import pytest
import requests

from conftest import Server

GREEDY = dict(temperature=0, max_tokens=12)
MESSAGES = [{"role": "user", "content": "Tell me about flash attention."}]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server.v1, api_key="unused", max_retries=0, timeout=120)


def tokenize(server, **body) -> list[int]:
    r = requests.post(server.url + "/tokenize", json=body, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["tokens"]


def detokenize(server, tokens) -> str:
    r = requests.post(server.url + "/detokenize", json={"tokens": tokens}, timeout=30)
    assert r.status_code == 200, r.text
    return r.json()["prompt"]


def completion_ids(client, prompt, max_tokens) -> list[int]:
    """Greedy output token ids of a raw prompt (text or ids), through /v1/completions logprobs."""
    r = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=max_tokens, logprobs=0,
                                  extra_body={"return_tokens_as_token_ids": True})
    return [int(t.split(":")[1]) for t in r.choices[0].logprobs.tokens]


def test_models(client, server):
    models = client.models.list()
    assert [m.id for m in models.data] == ["tiny"]
    assert models.data[0].owned_by == "flashnext"
    assert requests.get(server.url + "/health", timeout=10).status_code == 200


def test_chat_non_streaming(client, server):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
    assert r.object == "chat.completion"
    assert r.model == "tiny"
    choice = r.choices[0]
    assert choice.message.role == "assistant"
    assert choice.finish_reason == "length"  # random weights: no EOS within 12 tokens
    prompt = tokenize(server, messages=MESSAGES)
    assert r.usage.prompt_tokens == len(prompt)
    assert r.usage.completion_tokens == 12
    assert r.usage.total_tokens == len(prompt) + 12
    # The chat endpoint renders the template then generates exactly what a raw completion of that prompt does.
    ids = completion_ids(client, prompt, 12)
    text = detokenize(server, ids)
    got = (getattr(choice.message, "reasoning_content", None) or "") + (choice.message.content or "")
    assert got.replace("<think>", "").replace("</think>", "") == text.replace("<think>", "").replace("</think>", "")


def test_chat_streaming_matches_non_streaming(client):
    full = client.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
    stream = client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True,
                                            stream_options={"include_usage": True}, **GREEDY)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    content = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    reasoning = "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks if c.choices)
    assert content == (full.choices[0].message.content or "")
    assert reasoning == (getattr(full.choices[0].message, "reasoning_content", None) or "")
    finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert finals == ["length"]
    assert chunks[-1].choices == [] and chunks[-1].usage is not None  # include_usage: the last chunk
    assert chunks[-1].usage.model_dump() == full.usage.model_dump()
    assert all(c.usage is None for c in chunks[:-1])


def test_completions(client, server):
    prompt = "The quick brown fox"
    r = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=10)
    assert r.object == "text_completion"
    assert r.choices[0].finish_reason == "length"
    assert r.usage.prompt_tokens == len(tokenize(server, prompt=prompt))
    assert r.usage.completion_tokens == 10
    s = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=10, stream=True)
    assert "".join(c.choices[0].text for c in s) == r.choices[0].text
    e = client.completions.create(model="tiny", prompt=prompt, temperature=0, max_tokens=10, echo=True)
    assert e.choices[0].text == prompt + r.choices[0].text
    # A prompt of token ids is the same request.
    ids = tokenize(server, prompt=prompt)
    assert client.completions.create(model="tiny", prompt=ids, temperature=0, max_tokens=10).choices[0].text == \
        r.choices[0].text
    # Default max_tokens of completions is 16 (OpenAI, vLLM).
    assert client.completions.create(model="tiny", prompt=prompt, temperature=0).usage.completion_tokens == 16


def test_stop_string_and_seed(client):
    base = client.completions.create(model="tiny", prompt="Once upon a time", temperature=0, max_tokens=20)
    text = base.choices[0].text
    assert len(text) > 4
    stop = text[len(text) // 2: len(text) // 2 + 3]
    cut = client.completions.create(model="tiny", prompt="Once upon a time", temperature=0, max_tokens=20, stop=[stop])
    assert cut.choices[0].finish_reason == "stop"
    assert cut.choices[0].text == text[: text.index(stop)]
    assert cut.choices[0].model_extra.get("stop_reason") == stop
    # Seeded sampling is reproducible; penalties are accepted.
    kw = dict(model="tiny", prompt="Once upon a time", temperature=1.0, top_p=0.9, seed=7, max_tokens=16,
              presence_penalty=0.5, frequency_penalty=0.5,
              extra_body={"repetition_penalty": 1.2, "top_k": 50, "min_p": 0.01})
    first = client.completions.create(**kw).choices[0].text
    assert client.completions.create(**kw).choices[0].text == first
    # ... and depends on the seed: 16 tokens sampled at temperature 1 from a random model agree by chance with
    # probability far below 1e-9, so a server that ignores the seed fails here.
    assert client.completions.create(**{**kw, "seed": 8}).choices[0].text != first


def test_logprobs(client):
    r = client.chat.completions.create(model="tiny", messages=MESSAGES, temperature=0, max_tokens=6, logprobs=True,
                                       top_logprobs=3)
    content = r.choices[0].logprobs.content
    assert len(content) == 6
    for entry in content:
        assert len(entry.top_logprobs) == 3
        # Greedy picks the most likely token: its log-probability is the first of the top ones.
        assert entry.logprob == pytest.approx(entry.top_logprobs[0].logprob)
        assert entry.top_logprobs[0].logprob >= entry.top_logprobs[1].logprob >= entry.top_logprobs[2].logprob
        assert sum(math.exp(t.logprob) for t in entry.top_logprobs) <= 1 + 1e-5
        assert entry.bytes == list(entry.token.encode("utf-8")) or "\ufffd" in entry.token
    c = client.completions.create(model="tiny", prompt="Hello", temperature=0, max_tokens=4, logprobs=2,
                                  extra_body={"return_tokens_as_token_ids": True})
    lp = c.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == 4
    assert lp.text_offset[0] == 0
    for tok, l, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert l == pytest.approx(max(top.values()))


def test_tokenize_detokenize_round_trip(server):
    text = "Hello, wörld! 你好 <|im_start|>"
    ids = tokenize(server, prompt=text)
    assert detokenize(server, ids) == text
    r = requests.post(server.url + "/tokenize", json={"prompt": "hi there", "return_token_strs": True}, timeout=10).json()
    assert r["count"] == len(r["tokens"]) == len(r["token_strs"])
    assert r["max_model_len"] == 1024
    # Chat messages are rendered with the model's (Qwen3) template.
    rendered = detokenize(server, tokenize(server, messages=MESSAGES))
    assert rendered == "<|im_start|>user\nTell me about flash attention.<|im_end|>\n<|im_start|>assistant\n"
    no_think = detokenize(server, tokenize(server, messages=MESSAGES, chat_template_kwargs={"enable_thinking": False}))
    assert no_think.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_tool_call_round_trip_qwen3_template(client, server):
    tools = [{"type": "function", "function": {"name": "get_weather", "description": "Weather of a city",
                                               "parameters": {"type": "object",
                                                              "properties": {"city": {"type": "string"}},
                                                              "required": ["city"]}}}]
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function",
             "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]
    r = client.chat.completions.create(model="tiny", messages=messages, tools=tools, **GREEDY)
    # Random weights: 12 tokens with no EOS and no tool-call markup, so the request ends by length and its text is
    # the raw completion of the rendered prompt.
    assert r.choices[0].finish_reason == "length"
    assert r.usage.completion_tokens == 12
    assert r.choices[0].message.tool_calls in (None, [])
    rendered = detokenize(server, tokenize(server, messages=messages, tools=tools))
    assert '"name": "get_weather"' in rendered  # the tools block of the system turn
    assert '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>' in rendered
    assert "<|im_start|>user\n<tool_response>\nsunny, 21 C\n</tool_response><|im_end|>" in rendered
    assert r.usage.prompt_tokens == len(tokenize(server, messages=messages, tools=tools))


def test_qwen38_template_reasoning_split_and_tools(qwen38_model_dir):
    """With the Qwen3.8 template the generation prompt opens <think>: the output is reasoning until </think>. The
    random model never closes it, so everything is reasoning_content; with enable_thinking=false it is content."""
    s = Server("--max-model-len", "2048", "--served-model-name", "tiny", model=qwen38_model_dir)
    try:
        client = openai.OpenAI(base_url=s.v1, api_key="unused", max_retries=0, timeout=120)
        prompt = tokenize(s, messages=MESSAGES)
        assert detokenize(s, prompt).endswith("<|im_start|>assistant\n<think>\n")
        expected = detokenize(s, completion_ids(client, prompt, 12))
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, **GREEDY)
        msg = r.choices[0].message
        assert msg.reasoning_content == expected.split("</think>")[0]
        if "</think>" not in expected:
            assert msg.content in (None, "")
        stream = client.chat.completions.create(model="tiny", messages=MESSAGES, stream=True, **GREEDY)
        chunks = [c for c in stream if c.choices]
        assert "".join(getattr(c.choices[0].delta, "reasoning_content", None) or "" for c in chunks) == \
            msg.reasoning_content

        off = dict(chat_template_kwargs={"enable_thinking": False})
        prompt_off = tokenize(s, messages=MESSAGES, **off)
        expected_off = detokenize(s, completion_ids(client, prompt_off, 12))
        r = client.chat.completions.create(model="tiny", messages=MESSAGES, extra_body=off, **GREEDY)
        assert r.choices[0].message.reasoning_content is None
        assert r.choices[0].message.content == expected_off

        # Tool-call round trip in Qwen3-Coder XML: string arguments raw, others JSON.
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
            "type": "object", "properties": {"city": {"type": "string"}, "days": {"type": "integer"}}}}}]
        messages = [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": "", "reasoning_content": "I should call the tool.", "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "sunny"},
        ]
        rendered = detokenize(s, tokenize(s, messages=messages, tools=tools))
        assert ("<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n"
                "<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>") in rendered
        assert "<tool_response>\nsunny\n</tool_response>" in rendered
        r = client.chat.completions.create(model="tiny", messages=messages, tools=tools, **GREEDY)
        assert r.choices[0].message.reasoning_content  # the new turn thinks first
        # reasoning_effort is a template variable of this template; an unknown one is the template's 400.
        with pytest.raises(openai.BadRequestError, match="Unexpected reasoning effort"):
            client.chat.completions.create(model="tiny", messages=MESSAGES, reasoning_effort="max", **GREEDY)
    finally:
        s.stop()


def test_metrics(server, client):
    client.completions.create(model="tiny", prompt="count me", temperature=0, max_tokens=3)
    m = server.wait_idle()
    assert m['flashnext_requests_total{endpoint="completions",finish_reason="length"}'] >= 1
    assert m["flashnext_prompt_tokens_total"] > 0
    assert m["flashnext_generation_tokens_total"] >= 3
    assert m["flashnext_time_to_first_token_seconds_count"] >= 1
    assert m["flashnext_inter_token_latency_seconds_count"] >= 2
    assert m['flashnext_kv_cache_blocks{state="total"}'] > 0
    assert m["flashnext_kv_cache_usage_perc"] == 0
    assert m["flashnext_ple_rows_fetched_total"] > 0  # the bundled model has a PLE layer
    text = requests.get(server.url + "/metrics", timeout=10).text
    assert "# TYPE flashnext_time_to_first_token_seconds histogram" in text
    # running totals are counters, whatever the code keeps them in
    for name in ("flashnext_num_preemptions_total", "flashnext_prefix_cache_hits_total",
                 "flashnext_spec_decode_num_drafts_total", "flashnext_engine_steps_total"):
        assert f"# TYPE {name} counter" in text, name
    assert 'flashnext_inter_token_latency_seconds_bucket{le="+Inf"}' in text
