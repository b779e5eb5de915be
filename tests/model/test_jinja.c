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

/* A hang of the interpreter is a failure, not a stuck suite (one timeout for the suite:
 * criterion's per-test timeouts leak in its runner under LeakSanitizer). */
TestSuite(jinja, .timeout = 60);

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

/* The template's output with its length checked against strlen (no embedded NUL). */
static char *render_ok(const char *src)
{
    char *out = NULL;
    long n = render_lim(src, NULL, &out, NULL);
    cr_assert_geq(n, 0, "%s: %s", src, err);
    cr_assert_eq((size_t)n, strlen(out));
    return out;
}

Test(jinja, empty_repetition_is_immediate)
{
    expect("{{ '' * 10**12 }}|{{ ([] * 10**12) | length }}|{{ 10**12 * '' }}", "|0|");
    expect("{{ 'ab' * -1 }}{{ [1] * -3 }}{{ 'a' * true }}", "[]a");
    expect_error("{{ [1, 2] * 10**12 }}", -1, "a repetition longer than");
}

Test(jinja, integer_ops_never_trap)
{
    const char *min = "{% set x = -9223372036854775807 - 1 %}";
    char src[256];
    static const struct { const char *expr, *want; } ok[] = {
        {"x is divisibleby(-1)", "True"}, {"x % -1", "0"}, {"x // 2", "-4611686018427387904"},
        {"x is even", "True"}, {"9223372036854775807 // -2", "-4611686018427387904"},
        {"9223372036854775807 % -2", "-1"}, {"x + 9223372036854775807", "-1"},
        {"(-2) ** 63", "-9223372036854775808"}, {"2 ** 62", "4611686018427387904"},
        {"2 ** -2", "0.25"}, {"x / -1", "9.223372036854776e+18"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        snprintf(src, sizeof src, "%s{{ %s }}", min, ok[i].expr);
        expect(src, ok[i].want);
    }
    static const struct { const char *expr, *op; } bad[] = {
        {"x // -1", "//"}, {"x | abs", "abs"}, {"-x", "unary -"}, {"x - 1", "-"},
        {"x * -1", "*"}, {"9223372036854775807 + 1", "+"}, {"2 ** 1000000", "**"},
        {"10 ** 10 ** 10", "**"}, {"4294967296 * 4294967296", "*"}, {"2 ** 63", "**"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(src, sizeof src, "%s{{ %s }}", min, bad[i].expr);
        char want[64];
        snprintf(want, sizeof want, "integer overflow in %s", bad[i].op);
        expect_error(src, -1, want);
    }
    expect_error("{{ 0 ** -1 }}", -1, "division by zero");
    expect_error("{{ 10.0 ** 400 }}", -1, "float overflow in **");
    expect_error("{{ (-8) ** 0.5 }}", -1, "complex");
}

Test(jinja, integer_literals_and_conversions)
{
    expect("{{ 9223372036854775807 }}", "9223372036854775807");
    expect_error("{{ 12345678901234567890123 }}", -2, "integer literal 12345678901234567890123 "
                 "does not fit in 64 bits");
    expect_error("{{ '99999999999999999999999' | int }}", -1, "integer overflow in int");
    expect_error("{{ ('9' * 100) | int }}", -1, "integer overflow in int");
    expect_error("{{ 1e30 | int }}", -1, "integer overflow in int");
    expect_error("{% set x = 'inf' %}{{ x | float | int }}", -1, "cannot convert float infinity");
    /* Python's int filter: int(s), else int(float(s)), else the default */
    expect("{{ ' +1_000 ' | int }}|{{ '1e3' | int }}|{{ '12.7' | int }}|{{ -12.7 | int }}|"
           "{{ '1e999' | int }}|{{ 'nan' | int }}|{{ '1__0' | int }}|{{ '0x10' | int }}|"
           "{{ ('1' ~ ' ' * 70) | int }}", "1000|1000|12|-12|0|0|0|0|1");
    expect("{{ '0x10' | float }}|{{ '1_0.5' | float }}|{{ ('2.5' ~ ' ' * 70) | float }}|"
           "{{ '1e999' | float }}", "0.0|10.5|2.5|inf");
}

Test(jinja, float_division_as_python)
{
    expect("{{ 1e308 % 3.0 }}|{{ -7.5 % 2 }}|{{ 7.5 // -2 }}|{{ -0.0 // 1 }}|{{ 5 % -0.5 }}",
           "2.0|0.5|-4.0|-0.0|-0.0");
    expect_error("{{ 5.5 // 0 }}", -1, "division by zero");
    expect("{{ 9007199254740993 == 9007199254740992.0 }}|{{ 9007199254740993 > 9007199254740992.0 }}|"
           "{{ 9007199254740992.0 < 9007199254740993 }}", "False|True|True");
}

Test(jinja, range_near_the_int64_bounds)
{
    expect("{{ range(-9223372036854775807, 9223372036854775807, 4611686018427387904) | list }}",
           "[-9223372036854775807, -4611686018427387903, 1, 4611686018427387905]");
    expect("{{ range(9223372036854775805, 9223372036854775807) | list }}|"
           "{{ range(-9223372036854775806, -9223372036854775807 - 1, -1) | list }}",
           "[9223372036854775805, 9223372036854775806]|[-9223372036854775806, -9223372036854775807]");
}

Test(jinja, slices_with_huge_steps)
{
    expect("{{ [1, 2, 3][2::9223372036854775807] }}|{{ 'abc'[2::9223372036854775807] }}|"
           "{{ [1, 2, 3][::-9223372036854775807] }}|{{ 'abc'[0::-9223372036854775807 - 1] }}",
           "[3]|c|[3]|a");
}

Test(jinja, widths_are_not_capped)
{
    expect("{{ ('a\\nb' | indent(300)) | length }}|{{ ([1] | tojson(indent=100)) | length }}",
           "303|105");
}

Test(jinja, strftime_now_of_a_long_format)
{
    char *out = render_ok("{{ strftime_now('%Y' * 100000) }}");
    cr_assert_eq(strlen(out), 400000);
    cr_assert(!strncmp(out, out + 4, 4 * 99999));
    free(out);
    expect_error("{{ strftime_now('%Y' * 3000000) }}", -1, "strftime_now: the output exceeds");
}

Test(jinja, loop_cycle)
{
    expect("{% for x in [1, 2, 3] %}{{ loop.cycle('a', 'b') }}{% endfor %}", "aba");
    expect_error("{% for x in [1] %}{{ loop.cycle() }}{% endfor %}", -1, "no items for cycling");
}

Test(jinja, cycles_print_as_python)
{
    const char *ns = "{% set ns = namespace() %}{% set ns.me = ns %}";
    char src[512];
    static const struct { const char *expr, *want; } ok[] = {
        {"ns", "<Namespace {'me': <Namespace {...}>}>"},
        {"ns | string | length", "37"},
        {"ns == ns", "True"}, {"ns in [ns]", "True"}, {"ns.me.me.me is defined", "True"},
        {"[ns] == [ns.me]", "True"}, {"ns == namespace()", "False"},
        {"namespace(a=1) == namespace(a=1)", "False"},
    };
    for (size_t i = 0; i < sizeof ok / sizeof *ok; i++) {
        snprintf(src, sizeof src, "%s{{ %s }}", ns, ok[i].expr);
        expect(src, ok[i].want);
    }
    expect("{% set ns = namespace(a=[1]) %}{% set ns.a = [ns] %}{{ ns.a }}",
           "[<Namespace {'a': [...]}>]");
    expect("{% set ns = namespace() %}{% set ns.me = {'x': ns} %}{{ ns.me }}",
           "{'x': <Namespace {'me': {...}}>}");
    snprintf(src, sizeof src, "%s{{ ns | tojson }}", ns);
    expect_error(src, -1, "tojson: a namespace is not JSON serializable");
    snprintf(src, sizeof src, "%s{{ [ns.me] | tojson }}", ns);
    expect_error(src, -1, "not JSON serializable");
    /* nesting without a cycle: deep, and shared (a value made of 2^60 paths) */
    const char *deep = "{% set ns = namespace(x=[], y=[]) %}{% for i in range(10000) %}"
                       "{% set ns.x = [ns.x] %}{% set ns.y = [ns.y] %}{% endfor %}";
    snprintf(src, sizeof src, "%s{{ ns.x }}", deep);
    expect_error(src, -1, "a value nested deeper than");
    snprintf(src, sizeof src, "%s{{ ns.x == ns.y }}", deep);
    expect_error(src, -1, "a value nested deeper than");
    snprintf(src, sizeof src, "%s{{ ns.x | tojson }}", deep);
    expect_error(src, -1, "nested deeper than");
    const char *wide = "{% set ns = namespace(a=[], b=[]) %}{% for i in range(60) %}"
                       "{% set ns.a = [ns.a, ns.a] %}{% set ns.b = [ns.b, ns.b] %}{% endfor %}";
    snprintf(src, sizeof src, "%s{{ ns.a == ns.b }}", wide);
    expect_error(src, -1, "loop iterations");
    kvp_jinja_limits lim = {.max_output = 1 << 20};
    char *out = NULL;
    snprintf(src, sizeof src, "%s{{ ns.a | tojson }}", wide);
    cr_assert_eq(render_lim(src, &lim, &out, NULL), -1);
    cr_assert(strstr(err, "the output exceeds"), "%s", err);
    snprintf(src, sizeof src, "%s{{ ns.a }}", wide);
    cr_assert_eq(render_lim(src, &lim, &out, NULL), -1);
    cr_assert(strstr(err, "the output exceeds"), "%s", err);
    snprintf(src, sizeof src, "%s{{ ns.a in [ns.b] }}", wide);
    expect_error(src, -1, "loop iterations");
}

/* Work that scales with the data inside one step (a scan of a long string or list, a
 * strip by a long set of characters) is bounded too. */
Test(jinja, scans_of_long_values_are_bounded)
{
    expect("{% set s = 'a' * 1000000 %}{{ s.strip('b' * 1000000 ~ 'a') | length }}|"
           "{{ 'xyzzy'.strip('zyx') }}|{{ 'héé'.rstrip('é') }}|{{ 'aé'.lstrip('éa') }}", "0||h|");
    expect_error("{% set l = [0] * 200000 %}{% for i in [0] * 700000 %}"
                 "{% if -1 in l %}{% endif %}{% endfor %}", -1, "loop iterations");
    expect_error("{% set s = 'a' * 4000000 %}{% for i in [0] * 100000 %}"
                 "{% if 'b' in s or s.find('b') > 0 %}{% endif %}{% endfor %}",
                 -1, "loop iterations");
    expect_error("{% set s = 'a' * 4000000 %}{% set t = 'a' * 4000000 %}{% for i in [0] * 100000 %}"
                 "{% if s == t and s.startswith(t) and s.endswith(t) %}{% endif %}{% endfor %}",
                 -1, "loop iterations");
}

/* Indexing a string and its length need no memory of its size. */
Test(jinja, string_index_and_length_allocate_nothing_of_their_size)
{
    expect("{% set s = 'é' * 100000 ~ 'x' %}{% for i in range(3000) %}"
           "{% if s[i] != 'é' or s | length != 100001 %}bad{% endif %}{% endfor %}"
           "{{ s[-1] }}{{ s[100000] }}{{ s[-100001] }}{{ s[100001] is defined }}", "xxéFalse");
}

/* A lookup in a dict (or a scope) of many keys costs steps by its size. */
Test(jinja, lookups_in_big_dicts_are_bounded)
{
    size_t cap = 2000 * 24 + 512, k = 0;
    char *src = malloc(cap);
    k += (size_t)snprintf(src + k, cap - k, "{%% set d = {");
    for (int i = 0; i < 2000; i++)
        k += (size_t)snprintf(src + k, cap - k, "%s'k%d': %d", i ? ", " : "", i, i);
    snprintf(src + k, cap - k, "} %%}{{ d.k1999 }}{{ d['k0'] }}{{ 'k5' in d }}{%% for i in [0] * 700000 %%}"
             "{%% if d.k1999 != 1999 %%}bad{%% endif %%}{%% endfor %%}");
    expect_error(src, -1, "steps");
    free(src);
}
