#!/usr/bin/env python3
"""Renders small Jinja2 templates with jinja2, configured the way transformers renders chat templates, and writes
the expected outputs to tests/data/chat/jinja_cases.json for tests/chat/jinja_cases_test.cpp.

Environment (transformers 5 `utils/chat_template_utils.py::_compile_jinja_template`):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]) with `tojson`
replaced by json.dumps(ensure_ascii=False, ...) and the global `raise_exception`.

It first checks that this environment reproduces the two reference files made by transformers itself
(tests/data/fixtures/tiny-b/tokenizer_cases.json and tests/data/tokenizers/qwen3.8/render_cases.json).

Usage: .venv/bin/python tools/make_jinja_cases.py   (needs `pip install jinja2`)
"""
import json
import pathlib

import jinja2
import jinja2.ext
from jinja2.exceptions import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = pathlib.Path(__file__).resolve().parent.parent


def make_env():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


ENV = make_env()


def render(template, variables):
    try:
        return {"output": ENV.from_string(template).render(**variables)}
    except Exception as e:  # noqa: BLE001 - the error is the expected result
        return {"error": str(e), "error_type": type(e).__name__}


def check_reference_files():
    tiny = json.loads((ROOT / "tests/data/fixtures/tiny-b/tokenizer_cases.json").read_text())
    cfg = json.loads((ROOT / "models/tiny-b-random/tokenizer_config.json").read_text())
    tpl = cfg["chat_template"]
    for case in tiny["chat"]:
        got = render(tpl, dict(messages=case["messages"], tools=None, add_generation_prompt=case["add_generation_prompt"],
                               enable_thinking=case["enable_thinking"], eos_token=cfg["eos_token"]))
        assert got.get("output") == case["rendered"], (case, got)
    q = json.loads((ROOT / "tests/data/tokenizers/qwen3.8/render_cases.json").read_text())
    tpl = (ROOT / "tests/data/tokenizers/qwen3.8/chat_template.jinja").read_text()
    for case in q["cases"]:
        got = render(tpl, dict(messages=case["messages"], tools=case["tools"],
                               add_generation_prompt=case["add_generation_prompt"], **case["vars"]))
        if "error" in case:
            assert got.get("error") == case["error"], (case, got)
        else:
            assert got.get("output") == case["rendered"], (case, got)
    print("reference files reproduced:", len(tiny["chat"]), "+", len(q["cases"]), "cases")


MSGS = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <there> & \"you\""},
    {"role": "assistant", "content": "Hello!", "reasoning_content": "\n  think  \n",
     "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"b": 2, "a": [1, "x"], "c": None}}}]},
    {"role": "tool", "content": "{\"ok\": true}"},
    {"role": "user", "content": "Ünïcödé ✓ 漢字 🙂"},
]

# (name, template, variables)
CASES = [
    # whitespace control, trim_blocks, lstrip_blocks
    ("ws_trim_blocks", "{% if true %}\nyes\n{% endif %}\nend", {}),
    ("ws_lstrip_blocks", "a\n    {% if true %}\n    b\n    {% endif %}\nc", {}),
    ("ws_minus", "a   {%- if true -%}   b   {%- endif -%}   c", {}),
    ("ws_plus_disables_lstrip", "a\n    {%+ if true %}b{% endif %}", {}),
    ("ws_plus_disables_trim", "{% if true +%}\nb{% endif %}", {}),
    ("ws_variable_not_lstripped", "a\n    {{ 'x' }}\n", {}),
    ("ws_variable_minus", "a  \n  {{- 'x' -}}  \n  b", {}),
    ("ws_comment", "a\n  {# note #}\nb{#- x -#}  c", {}),
    ("ws_trailing_newline_dropped", "line\n", {}),
    ("ws_crlf", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("raw_block", "{% raw %}{{ not parsed }}{% endraw %}", {}),
    ("ws_mixed_line", "x {% if true %}y{% endif %}\n  z", {}),
    # literals and operators
    ("lit_numbers", "{{ 1 }} {{ -2 }} {{ 1.5 }} {{ 1e3 }} {{ 2.50 }} {{ 0.1 + 0.2 }} {{ 1_000 }} {{ 0x1F }}", {}),
    ("lit_strings", "{{ 'a\\'b' }} {{ \"c\\\"d\" }} {{ 'tab\\there' }} {{ 'uni\\u00e9' }} {{ 'x' 'y' }}", {}),
    ("lit_containers", "{{ [1, 'a', none, true, false, 1.0] }} {{ (1,) }} {{ (1, 2) }} {{ () }} {{ {'k': [1], 2: 'v'} }}", {}),
    ("lit_repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' \"', 'nl\\n'] }}", {}),
    ("arith", "{{ 7 + 3 }} {{ 7 - 10 }} {{ 7 * 3 }} {{ 7 / 2 }} {{ 6 / 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} "
              "{{ -7 % 3 }} {{ 7 % -3 }} {{ 2 ** 10 }} {{ 2 ** -1 }} {{ 7.5 // 2 }} {{ 7.5 % 2 }}", {}),
    ("arith_mixed", "{{ 1 + 2.5 }} {{ true + 1 }} {{ 'ab' * 3 }} {{ 3 * 'ab' }} {{ [1] * 2 }} {{ [1, 2] + [3] }} "
                    "{{ 'a' + 'b' }} {{ -(3) }} {{ +3 }} {{ 10 / 4 * 2 }}", {}),
    ("float_repr", "{{ 1e16 }} {{ 1e15 }} {{ 0.0001 }} {{ 0.00001 }} {{ 123456789.123 }} {{ 2/3 }} {{ 1.5e-7 }} {{ 1e100 }} "
                   "{{ 3.0 * 1 }} {{ -0.0 }}", {}),
    ("concat", "{{ 'a' ~ 1 ~ none ~ true ~ [1] ~ undefined_thing ~ 2.0 }}", {}),
    ("precedence", "{{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 2 ** 3 ** 2 }} {{ -2 ** 2 }} {{ not true or true }} "
                   "{{ not (true or true) }} {{ 'a' ~ (1 + 2) }} {{ 2 * 3 ~ 4 }} {{ 1 if 2 > 1 and not 0 else 0 }}", {}),
    ("err_precedence_concat", "{{ 1 + 2 ~ 3 }}", {}),  # + binds looser than ~ in Jinja2: 1 + '23'
    ("compare", "{{ 1 < 2 }} {{ 2 <= 2 }} {{ 3 > 4 }} {{ 'a' < 'b' }} {{ [1, 2] < [1, 3] }} {{ 1 == 1.0 }} {{ 1 != 2 }} "
                "{{ 1 < 2 < 3 }} {{ 3 > 2 > 2 }} {{ true == 1 }} {{ none == none }} {{ [1] == [1] }} {{ (1,) == [1] }}", {}),
    ("in_operator", "{{ 'a' in 'cat' }} {{ 'x' not in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} "
                    "{{ 'v' in {'k': 'v'} }} {{ 1 in missing }} {{ 'xhigh' in ('xhigh', 'low') }}", {}),
    ("and_or_values", "{{ 0 or 'x' }} {{ 'a' and 'b' }} {{ '' and 'b' }}|{{ none or [] }} {{ 1 and 0 }}", {}),
    ("condexpr", "{{ 'y' if true else 'n' }} {{ 'y' if false else 'n' }} [{{ 'y' if false }}] "
                 "{{ 'a' if false else 'b' if true else 'c' }} {{ (1 if false) is defined }}", {}),
    ("dict_equality", "{{ {'a': 1, 'b': 2} == {'b': 2, 'a': 1} }} {{ {'a': 1} == {'a': 2} }}", {}),
    # variables and attribute access
    ("attr_and_item", "{{ m.role }} {{ m['content'] }} {{ m.get('role') }} {{ m.get('nope', 'dflt') }} "
                      "{{ m.nope is defined }} {{ l[0] }} {{ l[-1] }} {{ l.1 }} {{ s[1] }} {{ s[-1] }}",
     {"m": {"role": "user", "content": "hi"}, "l": [10, 20, 30], "s": "héllo"}),
    ("undefined_printing", "[{{ nothing }}] [{{ m.nothing }}] [{{ nothing|default('d') }}] [{{ none }}] [{{ m.x|default(5) }}]",
     {"m": {}}),
    ("default_boolean", "{{ ''|default('e') }}|{{ ''|default('e', true) }}|{{ none|d('n', boolean=true) }}|{{ 0|default(3, true) }}", {}),
    ("slicing", "{{ l[1:] }} {{ l[:2] }} {{ l[::-1] }} {{ l[::2] }} {{ l[-2:] }} {{ l[1:-1] }} {{ s[1:3] }} {{ s[::-1] }} "
                "{{ l[5:] }} {{ l[3:1] }} {{ l[3:1:-1] }}",
     {"l": [1, 2, 3, 4], "s": "añbc"}),
    ("dict_methods", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %} {{ d.keys()|list }} {{ d.values()|list }}",
     {"d": {"z": 1, "a": [2], "m": None}}),
    ("getitem_fallback_attr", "{{ d['items'] is defined }} {{ 'abc'['upper']() }}", {"d": {"x": 1}}),
    # statements
    ("if_elif_else", "{% for x in [1, 2, 3, 4] %}{% if x == 1 %}one{% elif x == 2 %}two{% elif x == 3 %}three"
                     "{% else %}other{% endif %} {% endfor %}", {}),
    ("for_loop_vars", "{% for x in 'abc' %}{{ loop.index }}{{ loop.index0 }}{{ loop.revindex }}{{ loop.revindex0 }}"
                      "{{ loop.first }}{{ loop.last }}{{ loop.length }}|{% endfor %}", {}),
    ("for_previtem_nextitem", "{% for x in [1, 2, 3] %}{{ loop.previtem|default('-') }}<{{ x }}>{{ loop.nextitem|default('-') }} "
                              "{% endfor %}", {}),
    ("for_else", "{% for x in [] %}x{% else %}empty{% endfor %} {% for x in [1] %}{{ x }}{% else %}empty{% endfor %}", {}),
    ("for_filter", "{% for x in range(10) if x is odd %}{{ x }}{{ ',' if not loop.last }}{% endfor %}", {}),
    ("for_unpack", "{% for a, b in [[1, 2], (3, 4)] %}{{ a }}-{{ b }} {% endfor %}{% for k, v in d|items %}{{ k }}:{{ v }} {% endfor %}",
     {"d": {"x": 1, "y": 2}}),
    ("for_dict_keys", "{% for k in d %}{{ k }}{% endfor %}", {"d": {"b": 1, "a": 2}}),
    ("for_string_chars", "{% for c in 'héy' %}[{{ c }}]{% endfor %}", {}),
    ("for_nested_loop", "{% for a in [1, 2] %}{% for b in 'xy' %}{{ loop.index }}{{ b }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("for_cycle", "{% for x in range(5) %}{{ loop.cycle('odd', 'even') }} {% endfor %}", {}),
    ("break_continue", "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 5 %}{% break %}{% endif %}"
                       "{{ x }}{% endfor %}", {}),
    ("for_reversed_messages", "{% for m in messages[::-1] %}{{ (messages|length - 1) - loop.index0 }}:{{ m.role }} {% endfor %}",
     {"messages": MSGS}),
    ("set_scoping", "{% set x = 1 %}{% for i in [1, 2] %}{{ x }}{% set x = i * 10 %}{{ x }} {% endfor %}{{ x }}", {}),
    ("set_in_if_is_visible", "{% if true %}{% set y = 'inner' %}{% endif %}{{ y }}", {}),
    ("set_tuple", "{% set a, b = 1, 2 %}{{ a }}{{ b }} {% set t = 1, 2 %}{{ t }}", {}),
    ("set_block", "{% set x %}  Hello {{ 'W' }}  {% endset %}[{{ x }}] {% set y | upper | trim %} abc {% endset %}[{{ y }}]", {}),
    ("namespace", "{% set ns = namespace(count=0, found=false) %}{% for x in [1, 2, 3] %}{% set ns.count = ns.count + x %}"
                  "{% if x == 2 %}{% set ns.found = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.found }} {{ ns.missing is defined }}", {}),
    ("namespace_print", "{% set ns = namespace(a=1) %}{{ ns }}", {}),
    ("with_block", "{% set x = 'outer' %}{% with x = 'inner', y = 2 %}{{ x }}{{ y }}{% endwith %} {{ x }} {{ y is defined }}", {}),
    ("filter_block", "{% filter upper %}hello {{ 'x' }}{% endfilter %}", {}),
    ("print_stmt", "{% print 'a' ~ 1 %}", {}),
    # macros
    ("macro_basic", "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('A') }} {{ greet('B', '?') }} "
                    "{{ greet(punct='.', name='C') }}", {}),
    ("macro_varargs_kwargs", "{% macro m(a) %}{{ a }}|{{ varargs }}|{{ kwargs }}{% endmacro %}{{ m(1, 2, 3, x=4) }}", {}),
    ("macro_missing_arg", "{% macro m(a, b) %}[{{ a }}][{{ b }}][{{ b is defined }}]{% endmacro %}{{ m(1) }}", {}),
    ("macro_default_refers_param", "{% macro m(a, b=a * 2) %}{{ b }}{% endmacro %}{{ m(3) }}", {}),
    ("macro_recursion", "{% macro fact(n) %}{% if n <= 1 %}1{% else %}{{ n * fact(n - 1)|int }}{% endif %}{% endmacro %}{{ fact(5) }}", {}),
    ("macro_sees_globals_and_namespace", "{% set ns = namespace(v=0) %}{% macro bump() %}{% set ns.v = ns.v + 1 %}{{ g }}{% endmacro %}"
                                         "{{ bump() }}{{ bump() }} {{ ns.v }}", {"g": "G"}),
    ("macro_output_trim", "{% macro m() %}\n   text   \n{% endmacro %}[{{ m()|trim }}] [{{ m() }}]", {}),
    ("call_block", "{% macro wrap(tag) %}<{{ tag }}>{{ caller() }}</{{ tag }}>{% endmacro %}{% call wrap('b') %}bold {{ 1 + 1 }}{% endcall %}", {}),
    ("call_block_args", "{% macro each(items) %}{% for i in items %}{{ caller(i) }}{% endfor %}{% endmacro %}"
                        "{% call(x) each([1, 2]) %}<{{ x }}>{% endcall %}", {}),
    # filters
    ("f_tojson", "{{ d|tojson }}", {"d": {"b": [1, 2.0, "é\n\"\\/<>&'", None, True], "a": {}, "c": [], "n": -3, "f": 1e20}}),
    ("f_tojson_indent", "{{ d|tojson(indent=2) }}", {"d": {"b": [1, {"x": None}], "a": {}, "c": []}}),
    ("f_tojson_sort_keys", "{{ d|tojson(sort_keys=true) }} {{ d|tojson(separators=(',', ':')) }} {{ 'ü'|tojson(ensure_ascii=true) }} {{ '🙂'|tojson(ensure_ascii=true) }}",
     {"d": {"b": 1, "a": [1, 2]}}),
    ("f_tojson_scalars", "{{ 'x'|tojson }} {{ 1|tojson }} {{ 1.5|tojson }} {{ none|tojson }} {{ true|tojson }} {{ (1, 2)|tojson }}", {}),
    ("f_string_safe", "{{ 1|string }} {{ none|string }} {{ [1, 'a']|string }} {{ {'a': 1}|tojson|safe }} {{ true|string }}", {}),
    ("f_trim", "[{{ '  a b \n'|trim }}] [{{ 'xxaxx'|trim('x') }}] [{{ undefined_var|trim }}] [{{ '\u3000a\u00a0'|trim }}]", {}),
    ("f_length", "{{ 'héllo'|length }} {{ [1, 2]|length }} {{ {'a': 1}|length }} {{ x|length }} {{ 'ab'|count }}", {}),
    ("f_first_last", "{{ [1, 2, 3]|first }} {{ [1, 2, 3]|last }} {{ 'abc'|first }} {{ 'abc'|last }} [{{ []|first }}]", {}),
    ("f_join", "{{ [1, 2, 3]|join(', ') }} {{ ['a', 'b']|join }} {{ users|join(', ', attribute='name') }}",
     {"users": [{"name": "x"}, {"name": "y"}]}),
    ("f_list_items", "{{ 'ab'|list }} {{ {'k': 1, 'j': 2}|items|list }} {{ {'a': 1}|list }} {{ x|items|list }}", {}),
    ("f_case", "{{ 'hello WORLD'|upper }} {{ 'HeLLo'|lower }} {{ 'hello world-foo(bar)'|title }} {{ 'hELLO world'|capitalize }}", {}),
    ("f_replace", "{{ 'aaa'|replace('a', 'b') }} {{ 'aaa'|replace('a', 'b', 2) }} {{ 'abc'|replace('', '-') }}", {}),
    ("f_reverse", "{{ 'abc'|reverse }} {{ [1, 2, 3]|reverse|list }}", {}),
    ("f_sort_unique", "{{ [3, 1, 2]|sort }} {{ ['b', 'A', 'a', 'C']|sort }} {{ ['b', 'A', 'a']|sort(case_sensitive=true) }} "
                      "{{ [3, 1, 2]|sort(reverse=true) }} {{ ['a', 'A', 'b']|unique|list }} {{ users|sort(attribute='age')|map(attribute='name')|join(',') }}",
     {"users": [{"name": "x", "age": 30}, {"name": "y", "age": 20}, {"name": "z", "age": 25}]}),
    ("f_dictsort", "{{ {'b': 1, 'a': 2, 'C': 0}|dictsort }} {{ {'b': 1, 'a': 2}|dictsort(by='value') }}", {}),
    ("f_map_select", "{{ [1, 2, 3, 4]|select('odd')|list }} {{ [1, 2, 3, 4]|reject('odd')|list }} {{ [1, 2]|map('string')|join('+') }} "
                     "{{ msgs|selectattr('role', 'equalto', 'user')|map(attribute='content')|list }} "
                     "{{ msgs|rejectattr('role', 'eq', 'user')|list|length }} {{ [0, 1, '', 'a']|select|list }} "
                     "{{ msgs|map(attribute='missing', default='d')|list }}",
     {"msgs": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}]}),
    ("f_numbers", "{{ -3|abs }} {{ '42'|int }} {{ 'x'|int(7) }} {{ 3.9|int }} {{ '3.5'|float }} {{ 2|float }} {{ 2.5|round }} "
                  "{{ 3.14159|round(2) }} {{ 2.1|round(0, 'ceil') }} {{ [1, 2, 3]|sum }} {{ [3, 1, 2]|max }} {{ [3, 1, 2]|min }} "
                  "{{ ['b', 'A']|max }} {{ ' 12 '|int }}", {}),
    ("f_indent", "{{ 'a\nb\n\nc'|indent(2) }}|{{ 'a\nb'|indent(2, true) }}|{{ 'a\n\nb'|indent('>', blank=true) }}", {}),
    ("f_misc", "{{ '<a href=\"x\">&\\'</a>'|e }} {{ 'one two  three'|wordcount }} {{ '%s-%d'|format('a', 3) }} "
               "{{ [1, 2, 3, 4, 5]|batch(2)|list }} {{ 'hi'|center(6) }}|", {}),
    ("f_chained_filters", "{{ ' Hello '|trim|upper|replace('L', 'l')|length }}", {}),
    # tests
    ("tests_types", "{{ 'a' is string }} {{ 1 is string }} {{ 1 is number }} {{ 1.5 is number }} {{ true is number }} "
                    "{{ 1 is integer }} {{ true is integer }} {{ 1.0 is float }} {{ true is boolean }} {{ none is none }} "
                    "{{ {} is mapping }} {{ [] is mapping }} {{ [] is sequence }} {{ 'a' is sequence }} {{ {} is sequence }} "
                    "{{ 1 is sequence }} {{ [] is iterable }} {{ 'a' is iterable }} {{ 1 is iterable }} {{ x is iterable }} "
                    "{{ x is sequence }} {{ range is callable }} {{ 'a' is callable }}", {}),
    ("tests_values", "{{ true is true }} {{ 1 is true }} {{ false is false }} {{ 0 is false }} {{ x is defined }} {{ x is undefined }} "
                     "{{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 9 is divisibleby(4) }} {{ 'abc' is lower }} "
                     "{{ 'ABC' is upper }} {{ 2 is eq 2 }} {{ 2 is ne 3 }} {{ 2 is lt 3 }} {{ 2 is gt 3 }} {{ 2 is ge 2 }} "
                     "{{ 2 is le 1 }} {{ 2 is in [1, 2] }} {{ 'x' is not in 'abc' }} {{ 'upper' is filter }} {{ 'odd' is test }} "
                     "{{ none is sameas none }} {{ 1 is not none }}", {}),
    ("tests_namespace", "{% set ns = namespace() %}{{ ns is mapping }} {{ ns is defined }} {{ ns is iterable }}", {}),
    # string methods
    ("m_startswith", "{{ s.startswith('<tool') }} {{ s.endswith('>') }} {{ s.startswith(('x', '<t')) }} {{ s.endswith('nope') }}",
     {"s": "<tool_response>"}),
    ("m_split", "{{ 'a,b,,c'.split(',') }} {{ ' a  b \n c '.split() }} {{ 'a,b,c'.split(',', 1) }} {{ 'a,b,c'.rsplit(',', 1) }} "
                "{{ '  a b c  '.split(none, 1) }} {{ 'x</think>y</think>z'.split('</think>')[-1] }}", {}),
    ("m_strip", "[{{ '\n\nx\n'.strip('\n') }}] [{{ '  x  '.lstrip() }}] [{{ '  x  '.rstrip() }}] [{{ 'xyxhixy'.strip('xy') }}]", {}),
    ("m_case", "{{ 'aBc'.upper() }} {{ 'ÀBC'.lower() }} {{ \"they're bill's\".title() }} {{ 'hello WORLD'.capitalize() }}", {}),
    ("m_misc", "{{ 'a-b-c'.replace('-', '+') }} {{ 'a-b-c'.replace('-', '', 1) }} {{ 'hello'.find('l') }} {{ 'hello'.rfind('l') }} "
               "{{ 'hello'.find('z') }} {{ 'banana'.count('an') }} {{ ', '.join(['a', 'b']) }} {{ '12'.isdigit() }} {{ 'ab'.isalpha() }} "
               "{{ ' '.isspace() }} {{ 'a\nb\r\nc'.splitlines() }} {{ '5'.zfill(3) }} {{ 'ab'.ljust(4, '*') }} {{ 'ab'.rjust(4) }}", {}),
    ("m_format", "{{ '{} and {}'.format('a', 1) }} {{ '{1}{0}'.format('x', 'y') }} {{ '{name}!'.format(name='N') }} {{ '{{}}'.format() }}", {}),
    ("m_list", "{{ [1, 2, 1].count(1) }} {{ ['a', 'b'].index('b') }}", {}),
    ("percent_format", "{{ '%s is %d years' % ('Tom', 30) }} {{ '%.2f' % 3.14159 }} {{ '%5s|%-5s|' % ('a', 'b') }} {{ '%r' % 'x' }}", {}),
    # globals
    ("range", "{{ range(3)|list }} {{ range(1, 4)|list }} {{ range(10, 0, -3)|list }} {{ range(0)|list }}", {}),
    ("dict_global", "{{ dict(a=1, b='x') }} {{ dict(a=1)|tojson }}", {}),
    # chat-template-like
    ("chat_tool_call_args", "{% for m in messages %}{% if m.tool_calls %}{% for tc in m.tool_calls %}{% set tc = tc.function %}"
                            "{% for k, v in tc.arguments|items %}<{{ k }}={{ v|string if v is string else v|tojson|safe }}>{% endfor %}"
                            "{% endfor %}{% endif %}{% endfor %}", {"messages": MSGS}),
    ("chat_reasoning", "{% for m in messages %}{% if m.reasoning_content is string %}[{{ m.reasoning_content|trim }}]"
                       "{% endif %}{{ m.role }}:{{ m.content|length }} {% endfor %}", {"messages": MSGS}),
    ("chat_unicode", "{{ messages[-1].content }} {{ messages[-1].content|length }} {{ messages[-1].content[-1] }} {{ messages[-1]|tojson }}",
     {"messages": MSGS}),
    ("chat_previtem", "{% for m in messages %}{% if loop.previtem and loop.previtem.role != 'tool' %}+{% endif %}"
                      "{% if not loop.last and loop.nextitem.role != 'tool' %}|{% endif %}{{ m.role[0] }}{% endfor %}", {"messages": MSGS}),
    ("chat_index_message", "{{ messages[0].role }} {{ messages[1:]|length }} {{ (messages|first).content }} "
                           "{{ messages|selectattr('role', 'eq', 'user')|list|length }}", {"messages": MSGS}),
    ("bos_eos", "{{ bos_token }}x{{ eos_token }}", {"bos_token": "<s>", "eos_token": "</s>"}),
    # errors
    ("err_raise_exception", "{% if true %}{{ raise_exception('Custom failure: ' ~ 42) }}{% endif %}", {}),
    ("err_undefined_call", "{{ nope() }}", {}),
    ("err_undefined_attr_of_undefined", "{{ m.a.b }}", {"m": {}}),
    ("err_undefined_arith", "{{ x + 1 }}", {}),
    ("err_type_concat", "{{ 'a' + 1 }}", {}),
    ("err_not_iterable", "{% for x in 5 %}{% endfor %}", {}),
    ("err_items_not_mapping", "{{ 'abc'|items|list }}", {}),
    ("err_unknown_filter", "{{ 1|nofilter }}", {}),
    ("err_unknown_test", "{{ 1 is notatest }}", {}),
    ("err_macro_too_many_args", "{% macro m(a) %}{% endmacro %}{{ m(1, 2) }}", {}),
    ("err_macro_unknown_kwarg", "{% macro m(a) %}{% endmacro %}{{ m(b=1) }}", {}),
    ("err_list_append", "{% set l = [] %}{{ l.append(1) }}", {}),
    ("err_ns_assign_non_namespace", "{% set d = {} %}{% set d.x = 1 %}", {}),
    ("err_division_by_zero", "{{ 1 / 0 }}", {}),
    ("err_tojson_undefined", "{{ x|tojson }}", {}),
    ("err_syntax_unclosed", "{% if true %}never closed", {}),
    ("err_syntax_unknown_tag", "{% frobnicate %}", {}),
    ("err_syntax_bad_expr", "{{ 1 + }}", {}),
    ("err_syntax_unclosed_var", "{{ 1 ", {}),
    ("err_compare_types", "{{ 1 < 'a' }}", {}),
    ("err_len_of_none", "{{ none|length }}", {}),
    ("err_range_too_big", "{{ range(1000000)|length }}", {}),
]


# Whole chat templates (tests/data/chat/templates/README.md says where each comes from) rendered over a set of
# conversations, the way transformers calls them: messages, tools, documents=None, add_generation_prompt, the
# special tokens, then extra variables.
TEMPLATES = {
    "qwen3": ("models/tiny-b-random/tokenizer_config.json", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen3.8": ("tests/data/tokenizers/qwen3.8/chat_template.jinja", {}),
    "qwq-32b": ("tests/data/chat/templates/qwq-32b.jinja", {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>"}),
    "qwen3-coder": ("tests/data/chat/templates/qwen3-coder.jinja", {"eos_token": "<|im_end|>"}),
    "llama-3.3": ("tests/data/chat/templates/llama-3.3-70b-instruct.jinja",
                  {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}),
}

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather", "description": "  Current weather for a city.  ",
        "parameters": {"type": "object", "properties": {
            "city": {"type": "string", "description": "City name"},
            "unit": {"type": "string", "enum": ["c", "f"], "default": "c"},
            "days": {"type": ["integer", "null"], "minimum": 1}},
            "required": ["city"], "additionalProperties": False}}},
    {"type": "function", "function": {"name": "now", "description": "Current time", "parameters": {"type": "object", "properties": {}}}},
]

CONVERSATIONS = {
    "single_user": [{"role": "user", "content": "What is 2+2?"}],
    "system_user": [{"role": "system", "content": "  You are terse.  "}, {"role": "user", "content": "Name three primes."}],
    "multi_turn_think": [
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "<think>\nThe user greets.\n</think>\n\nHello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about GPUs."},
    ],
    "reasoning_content": [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!", "reasoning_content": "\ngreet back\n"},
        {"role": "user", "content": "Again?"},
        {"role": "assistant", "content": "Sure.", "reasoning_content": "ok"},
    ],
    "tool_round_trip": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Oslo and the time?"},
        {"role": "assistant", "content": "Let me check.", "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "get_weather", "arguments": {"city": "Oslo", "days": 2, "opts": {"unit": "c", "x": [1, 2]}}}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": -3, \"sky\": \"snow ❄\"}"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"id": "call_2", "type": "function", "function": {"name": "now", "arguments": {}}}]},
        {"role": "tool", "tool_call_id": "call_2", "content": "10:00"},
        {"role": "assistant", "content": "It is -3 °C with snow at 10:00."},
        {"role": "user", "content": "Thanks!"},
    ],
    "parallel_tools": [
        {"role": "user", "content": "Weather in Paris and Rome"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}},
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Rome", "unit": "f"}}}]},
        {"role": "tool", "content": "12"},
        {"role": "tool", "content": "70"},
    ],
    "unicode": [{"role": "user", "content": "Ünïcödé ✓ 漢字 🙂 \"quotes\" & <tags> \\ back\tslash"}],
}

VARIANTS = {
    "qwen3": [{}, {"enable_thinking": False}],
    "qwen3.8": [{}, {"enable_thinking": False}, {"preserve_thinking": False}, {"reasoning_effort": "low"},
                {"reasoning_effort": "medium", "enable_thinking": True}],
    "qwq-32b": [{}],
    "qwen3-coder": [{}],
    "llama-3.3": [{}, {"tools_in_user_message": False, "date_string": "01 Jan 2026"}],
}


def template_cases():
    cases = []
    for name, (path, tokens) in TEMPLATES.items():
        text = (ROOT / path).read_text()
        source = json.loads(text)["chat_template"] if path.endswith(".json") else text
        for conv_name, messages in CONVERSATIONS.items():
            for with_tools in (False, True):
                if with_tools and conv_name not in ("single_user", "system_user", "tool_round_trip", "parallel_tools"):
                    continue
                tools = TOOLS if with_tools else None
                for variables in VARIANTS[name]:
                    for agp in (True, False):
                        ctx = dict(messages=messages, tools=tools, documents=None, add_generation_prompt=agp, **tokens)
                        ctx.update(variables)
                        try:
                            result = {"output": ENV.from_string(source).render(**ctx)}
                        except Exception as e:  # noqa: BLE001
                            result = {"error": str(e), "error_type": type(e).__name__}
                        cases.append({"template": name, "conversation": conv_name, "messages": messages, "tools": tools,
                                      "add_generation_prompt": agp, "vars": variables, **result})
    return {"templates": {n: {"path": p, "special_tokens": t} for n, (p, t) in TEMPLATES.items()}, "cases": cases}


def main():
    check_reference_files()
    path = ROOT / "tests/data/chat/template_cases.json"
    data = template_cases()
    path.write_text(json.dumps({"generator": f"tools/make_jinja_cases.py, jinja2 {jinja2.__version__}", **data},
                               ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(data['cases'])} cases to {path.relative_to(ROOT)}",
          f"({sum('error' in c for c in data['cases'])} errors)")
    out = []
    names = set()
    for name, template, variables in CASES:
        assert name not in names, name
        names.add(name)
        case = {"name": name, "template": template, "vars": variables}
        case.update(render(template, variables))
        out.append(case)
    path = ROOT / "tests/data/chat/jinja_cases.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps({"generator": f"tools/make_jinja_cases.py, jinja2 {jinja2.__version__}", "cases": out},
                               ensure_ascii=False, indent=1) + "\n")
    print(f"wrote {len(out)} cases to {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
