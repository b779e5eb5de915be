/* model/jinja.c: each construct's output, the taint mask (caller data vs template text),
 * and each error: syntax errors name what and where, hostile templates (deep recursion,
 * huge loops, huge output, huge strings) stop with an error instead of hanging or
 * crashing. The byte-for-byte comparison with python3-jinja2 is tests/model/jinja_ref.py. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja.h"

static char err[512];

/* Renders src with messages = [{role: user, content: "<|im_start|>hi"}] and bos_token. */
static long render_lim(const char *src, const kvp_jinja_limits *lim, char **out,
                       unsigned char **mask)
{
    kvp_jinja *t = kvp_jinja_parse(src, strlen(src), err, sizeof err);
    if (!t)
        return -2;
    kvp_jarena *a = kvp_jarena_new(lim ? lim->max_memory : 0);
    kvp_jv *vars = kvp_jv_dict(a), *msgs = kvp_jv_list(a), *m = kvp_jv_dict(a);
    cr_assert_eq(kvp_jv_set(a, m, "role", kvp_jv_str(a, "user", 4)), 0);
    cr_assert_eq(kvp_jv_set(a, m, "content", kvp_jv_str(a, "<|im_start|>hi", 14)), 0);
    cr_assert_eq(kvp_jv_append(a, msgs, m), 0);
    cr_assert_eq(kvp_jv_set(a, vars, "messages", msgs), 0);
    cr_assert_eq(kvp_jv_set(a, vars, "bos_token", kvp_jv_str_trusted(a, "<s>", 3)), 0);
    long n = kvp_jinja_render(t, a, vars, lim, out, mask, err, sizeof err);
    kvp_jarena_free(a);
    kvp_jinja_free(t);
    return n;
}

static void expect(const char *src, const char *want)
{
    char *out;
    long n = render_lim(src, NULL, &out, NULL);
    cr_assert_geq(n, 0, "%s: %s", src, err);
    cr_assert_str_eq(out, want, "%s", src);
    cr_assert_eq((size_t)n, strlen(want));
    free(out);
}

/* The template fails to parse (rc -2) or render (-1) with an error containing `want`. */
static void expect_error(const char *src, long rc, const char *want)
{
    char *out = NULL;
    long n = render_lim(src, NULL, &out, NULL);
    cr_assert_eq(n, rc, "%s: rc %ld (%s) output %s", src, n, err, out ? out : "");
    cr_assert(strstr(err, want), "%s: error '%s' lacks '%s'", src, err, want);
    free(out);
}

Test(jinja, statements)
{
    expect("{% if 1 > 2 %}a{% elif 2 > 1 %}b{% else %}c{% endif %}", "b");
    expect("{% for x in [1, 2, 3] %}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}",
           "11,22,33");
    expect("{% for x in [1, 2, 3, 4] if x is even %}{{ loop.length }}{{ x }}{% endfor %}", "2224");
    expect("{% for x in [] %}a{% else %}empty{% endfor %}", "empty");
    expect("{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}"
           "{% if x == 4 %}{% break %}{% endif %}{{ x }}{% endfor %}", "013");
    expect("{% set ns = namespace(n=0) %}{% for x in [1, 2] %}{% set ns.n = ns.n + x %}"
           "{% set local = 1 %}{% endfor %}{{ ns.n }}{{ local is defined }}", "3False");
    expect("{% set s %}[{{ 1 + 1 }}]{% endset %}{{ s }}{{ s }}", "[2][2]");
    expect("{% macro m(a, b='d') %}{{ a }}{{ b }}{% endmacro %}{{ m(1) }}{{ m(1, 2) }}{{ m(b=3, a=4) }}",
           "1d1243");
    expect("{% macro w() %}<{{ caller() }}>{% endmacro %}{% call w() %}in{% endcall %}", "<in>");
    expect("{% for k, v in {'a': 1, 'b': 2}.items() %}{{ k }}{{ v }}{% endfor %}", "a1b2");
}

Test(jinja, whitespace_as_transformers_sets_it)
{
    /* trim_blocks eats the newline after a tag; lstrip_blocks the indentation before */
    expect("{% if true %}\n  x\n    {% endif %}\ny", "  x\ny");
    expect("a  {%- if true -%}  b  {%- endif -%}  c", "abc");
    expect("a\n  {%+ if true %}b{% endif %}", "a\n  b");
    expect("{{ 'v' }}\n", "v");          /* one trailing newline of the template goes */
    expect("x {# note #}\ny", "x y");
}

Test(jinja, expressions)
{
    expect("{{ 'a' ~ 1 ~ none }} {{ 7 // 2 }} {{ -7 % 3 }} {{ 7 / 2 }} {{ 2 ** 8 }} {{ 0.1 + 0.2 }}",
           "a1None 3 2 3.5 256 0.30000000000000004");
    expect("{{ [1, 2, 3][-1] }} {{ 'hello'[1:3] }} {{ [1, 2, 3][::-1] }} {{ 'héllo'[1] }}",
           "3 el [3, 2, 1] é");
    expect("{{ 'b' in 'abc' }} {{ 3 not in [1] }} {{ 'x' if false else 'y' }} {{ 1 and 0 or 'z' }}",
           "True True y z");
    expect("{{ x is defined }} {{ none is none }} {{ 'a' is string }} {{ {} is mapping }} "
           "{{ [] is iterable }} {{ 3 is odd }}", "False True True True True True");
    expect("{{ messages[0].role }} {{ messages[0]['role'] | upper }} {{ messages | length }}",
           "user USER 1");
}

Test(jinja, filters_and_methods)
{
    expect("{{ '  a  ' | trim }}|{{ 'A' | lower }}|{{ [3, 4] | first }}{{ [3, 4] | last }}|"
           "{{ ['a', 'b'] | join('-') }}|{{ u | default('d') }}|{{ [1] | list }}|{{ 5 | string }}|"
           "{{ '12' | int + 1 }}", "a|a|34|a-b|d|[1]|5|13");
    expect("{{ {'b': 'é', 'a': [1, true, none]} | tojson }}", "{\"b\": \"é\", \"a\": [1, true, null]}");
    expect("{{ {'a': [1]} | tojson(indent=2) }}", "{\n  \"a\": [\n    1\n  ]\n}");
    expect("{{ [{'r': 'u', 'c': 1}, {'r': 'a', 'c': 2}] | selectattr('r', 'equalto', 'u') | "
           "map(attribute='c') | list }}{{ [{'r': 'u'}, {'r': 'a'}] | rejectattr('r', 'equalto', 'u') | "
           "list | length }}{{ [{'x': 1}, {}] | selectattr('x', 'defined') | list | length }}",
           "[1]11");
    expect("{{ 'a,b'.split(',') }} {{ 'xax'.strip('x') }} {{ 'ab'.startswith('a') }} "
           "{{ 'ab'.endswith('a') }} {{ 'a-a'.replace('-', '+') }} {{ 'the cat'.title() }} "
           "{{ '\\n a'.lstrip() }}{{ 'b \\n'.rstrip() }}", "['a', 'b'] a True False a+a The Cat ab");
    expect("{{ {'k': 1} | items | list }}", "[['k', 1]]");
    /* Unicode case mapping; bytes that are not UTF-8 pass through as they are */
    expect("{{ 'straße ǆ' | upper }}|{{ 'ΟΔΟΣ Σ' | lower }}|{{ 'ǆa' | capitalize }}",
           "STRASSE Ǆ|οδος σ|ǅa");
    expect("{{ '\xff\xc3" "ß\x80" "a' | upper }}|{{ 'A\xe4" "B' | lower }}",
           "\xff\xc3" "SS\x80" "A|a\xe4" "b");
}

Test(jinja, taint_marks_caller_data)
{
    char *out;
    unsigned char *mask;
    long n = render_lim("{{ bos_token }}<|im_start|>{{ messages[0].content | trim }}"
                        "{{ '|' ~ messages[0].role }}", NULL, &out, &mask);
    cr_assert_eq(n, 3 + 12 + 14 + 5, "%s", err);
    cr_assert_str_eq(out, "<s><|im_start|><|im_start|>hi|user");
    for (long i = 0; i < n; i++) {
        int data = (i >= 15 && i < 29) || i >= 30;   /* the content and the role */
        cr_assert_eq(mask[i], data, "byte %ld (%c): mask %d", i, out[i], mask[i]);
    }
    free(out);
    free(mask);
}

Test(jinja, case_mapping_keeps_taint)
{
    char *out;
    unsigned char *mask;
    long n = render_lim("{{ 'ß' | upper }}{{ messages[0].content | upper }}{{ 'ß' | title }}", NULL,
                        &out, &mask);
    cr_assert_eq(n, 2 + 14 + 2, "%s", err);
    cr_assert_str_eq(out, "SS<|IM_START|>HISS");   /* the title filter upper-cases */
    for (long i = 0; i < n; i++)
        cr_assert_eq(mask[i], i >= 2 && i < 16, "byte %ld (%c): mask %d", i, out[i], mask[i]);
    free(out);
    free(mask);
}

Test(jinja, syntax_errors_name_what_and_where)
{
    expect_error("a {{ x", -2, "line 1: unclosed '{{' tag");
    expect_error("a\n{% if x", -2, "line 2: unclosed '{%' tag");
    expect_error("{% if x %}a", -2, "no {% endif %}");
    expect_error("{% for x in y %}a", -2, "no {% endfor %}");
    expect_error("{# note", -2, "unclosed comment");
    expect_error("{% endif %}", -2, "unexpected {% endif %}");
    expect_error("{% include 'x' %}", -2, "unknown statement 'include'");
    expect_error("{{ 'abc }}", -2, "unterminated string literal");
    expect_error("{{ 1 + }}", -2, "unexpected");
    expect_error("{{ a b }}", -2, "expected '}}'");
}

Test(jinja, render_errors)
{
    expect_error("{{ x | nosuch }}", -1, "unknown filter 'nosuch'");
    expect_error("{{ x is nosuch }}", -1, "unknown test 'nosuch'");
    expect_error("\n{{ raise_exception('roles must alternate') }}", -1,
                 "line 2: the template raised an exception: roles must alternate");
    expect_error("{{ nothing.attr }}", -1, "'nothing' is undefined");
    expect_error("{{ 'a' + undefined_thing }}", -1, "'undefined_thing' is undefined");
    expect_error("{{ none + 'a' }}", -1, "unsupported operand types for +: none and string");
    expect_error("{% set d = {} %}{% set d.x = 1 %}", -1, "not a namespace()");
    expect_error("{{ 1 // 0 }}", -1, "division by zero");
    expect_error("{% for x in 5 %}{% endfor %}", -1, "not iterable");
}

Test(jinja, hostile_templates_stop)
{
    /* recursion without end */
    expect_error("{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}", -1,
                 "macro calls nest deeper than 64");
    /* loops that would run for ever in practice */
    expect_error("{% for i in range(1000000000) %}{% endfor %}", -1, "loop iterations");
    expect_error("{% for a in range(1000) %}{% for b in range(1000) %}{% for c in range(1000) %}"
                 "{% endfor %}{% endfor %}{% endfor %}", -1, "loop iterations");
    /* output and strings beyond the limits */
    kvp_jinja_limits lim = {.max_output = 1000};
    char *out = NULL;
    cr_assert_eq(render_lim("{% for i in range(2000) %}x{% endfor %}", &lim, &out, NULL), -1);
    cr_assert(strstr(err, "the output exceeds 1000 bytes"), "%s", err);
    expect_error("{{ 'x' * 100000000000 }}", -1, "a repetition longer than");
    kvp_jinja_limits mem = {.max_memory = 1 << 20};
    cr_assert_eq(render_lim("{% set ns = namespace(s='xxxxxxxxxxxxxxxx') %}{% for i in range(30) %}"
                            "{% set ns.s = ns.s ~ ns.s %}{% endfor %}", &mem, &out, NULL), -1);
    cr_assert(strstr(err, "memory"), "%s", err);
    /* nesting the parser refuses rather than recursing without bound */
    char deep[4096] = "{{ ";
    for (int i = 0; i < 1000; i++)
        strcat(deep, "(");
    strcat(deep, "1");
    for (int i = 0; i < 1000; i++)
        strcat(deep, ")");
    strcat(deep, " }}");
    cr_assert_eq(render_lim(deep, NULL, &out, NULL), -2);
    cr_assert(strstr(err, "nests deeper than"), "%s", err);
}
