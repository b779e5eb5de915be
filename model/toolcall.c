/* Tool calls in a reply's text (model/toolcall.h): the formats' markers, a bounded JSON
 * value scanner, and the per-format splitters. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/toolcall.h"

static const char HERMES_OPEN[] = "<tool_call>", HERMES_CLOSE[] = "</tool_call>";
static const char PYTHON_TAG[] = "<|python_tag|>", MISTRAL_OPEN[] = "[TOOL_CALLS]";

static int has(const char *s, size_t n, const char *needle)
{
    return s && memmem(s, n, needle, strlen(needle)) != NULL;
}

enum kvp_tool_format kvp_toolcall_detect(const char *tmpl, size_t len, const char *family)
{
    if (has(tmpl, len, HERMES_OPEN))
        return KVP_TOOLS_HERMES;
    if (has(tmpl, len, MISTRAL_OPEN))
        return KVP_TOOLS_MISTRAL;
    if (has(tmpl, len, PYTHON_TAG) || has(tmpl, len, "ipython"))
        return KVP_TOOLS_LLAMA3;
    if (!family)
        return KVP_TOOLS_NONE;
    if (!strcmp(family, "chatml"))
        return KVP_TOOLS_HERMES;
    if (!strcmp(family, "llama3"))
        return KVP_TOOLS_LLAMA3;
    if (!strcmp(family, "mistral"))
        return KVP_TOOLS_MISTRAL;
    return KVP_TOOLS_NONE;
}

const char *kvp_toolcall_format_name(enum kvp_tool_format f)
{
    switch (f) {
    case KVP_TOOLS_HERMES: return "hermes";
    case KVP_TOOLS_LLAMA3: return "llama3";
    case KVP_TOOLS_MISTRAL: return "mistral";
    default: return "none";
    }
}

int kvp_toolcall_name_ok(const char *s, size_t n)
{
    if (n == 0 || n > KVP_TOOLCALL_NAME_MAX)
        return 0;
    for (size_t i = 0; i < n; i++) {
        char c = s[i];
        if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
              c == '_' || c == '-'))
            return 0;
    }
    return 1;
}

static int ws(char c)
{
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

static size_t skip_ws(const char *s, size_t n, size_t i)
{
    while (i < n && ws(s[i]))
        i++;
    return i;
}

/* ---- a JSON value's extent ---- */

/* The end of the string whose '"' is at s[i], or 0. */
static size_t string_end(const char *s, size_t n, size_t i)
{
    for (i++; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"')
            return i + 1;
        if (c < 0x20)
            return 0;
        if (c == '\\') {
            if (++i >= n)
                return 0;
            if (s[i] == 'u') {
                for (int k = 1; k <= 4; k++)
                    if (i + k >= n || !strchr("0123456789abcdefABCDEF", s[i + k]) || !s[i + k])
                        return 0;
                i += 4;
            } else if (!strchr("\"\\/bfnrt", s[i]) || !s[i]) {
                return 0;
            }
        }
    }
    return 0;
}

static size_t number_end(const char *s, size_t n, size_t i)
{
    size_t start = i;
    if (i < n && s[i] == '-')
        i++;
    if (i >= n || s[i] < '0' || s[i] > '9')
        return 0;
    if (s[i] == '0')
        i++;
    else
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    if (i < n && s[i] == '.') {
        if (++i >= n || s[i] < '0' || s[i] > '9')
            return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    if (i < n && (s[i] == 'e' || s[i] == 'E')) {
        i++;
        if (i < n && (s[i] == '+' || s[i] == '-'))
            i++;
        if (i >= n || s[i] < '0' || s[i] > '9')
            return 0;
        while (i < n && s[i] >= '0' && s[i] <= '9')
            i++;
    }
    /* a number at the very end may still grow: only whole when something follows */
    return i < n && i > start ? i : 0;
}

static size_t value_at(const char *s, size_t n, size_t i, int depth)
{
    i = skip_ws(s, n, i);
    if (i >= n || depth > 64)
        return 0;
    char c = s[i];
    if (c == '"')
        return string_end(s, n, i);
    if (c == '{' || c == '[') {
        char close = c == '{' ? '}' : ']';
        i = skip_ws(s, n, i + 1);
        if (i < n && s[i] == close)
            return i + 1;
        for (;;) {
            if (c == '{') {
                i = skip_ws(s, n, i);
                if (i >= n || s[i] != '"' || !(i = string_end(s, n, i)))
                    return 0;
                i = skip_ws(s, n, i);
                if (i >= n || s[i] != ':')
                    return 0;
                i++;
            }
            if (!(i = value_at(s, n, i, depth + 1)))
                return 0;
            i = skip_ws(s, n, i);
            if (i >= n)
                return 0;
            if (s[i] == close)
                return i + 1;
            if (s[i] != ',')
                return 0;
            i++;
        }
    }
    static const char *const lit[] = {"true", "false", "null"};
    for (int k = 0; k < 3; k++) {
        size_t l = strlen(lit[k]);
        if (n - i >= l && !memcmp(s + i, lit[k], l))
            return i + l;
    }
    return number_end(s, n, i);
}

size_t kvp_json_value_end(const char *s, size_t n)
{
    return value_at(s, n, 0, 0);
}

/* One call's object at s[i] (whole, ending at end): its "name" and its arguments (keys
 * `args_a` or `args_b`). 0, or -1 when it is not a call. */
static int call_of(const char *s, size_t i, size_t end, const char *args_a, const char *args_b,
                   kvp_toolcall *out)
{
    i = skip_ws(s, end, i);
    if (s[i] != '{')
        return -1;
    int got_name = 0, got_args = 0;
    i++;
    while (i < end) {
        i = skip_ws(s, end, i);
        if (s[i] == '}')
            break;
        if (s[i] == ',') {
            i++;
            continue;
        }
        size_t k0 = i, k1 = string_end(s, end, i);
        if (!k1)
            return -1;
        i = skip_ws(s, end, k1);
        i = skip_ws(s, end, i + 1);   /* past ':' (the scanner checked it) */
        size_t v0 = i, v1 = value_at(s, end, i, 1);
        if (!v1)
            return -1;
        size_t klen = k1 - k0 - 2;
        const char *key = s + k0 + 1;
        if (klen == 4 && !memcmp(key, "name", 4)) {
            if (s[v0] != '"' || !kvp_toolcall_name_ok(s + v0 + 1, v1 - v0 - 2))
                return -1;
            out->name = (kvp_range){v0 + 1, v1 - 1};
            got_name = 1;
        } else if ((klen == strlen(args_a) && !memcmp(key, args_a, klen)) ||
                   (klen == strlen(args_b) && !memcmp(key, args_b, klen))) {
            if (s[v0] != '{')
                return -1;
            out->args = (kvp_range){v0, v1};
            got_args = 1;
        }
        i = v1;
    }
    if (!got_name)
        return -1;
    if (!got_args)   /* a call without arguments takes none */
        out->args = (kvp_range){0, 0};
    return 0;
}

/* ---- the splitters ---- */

static void content(kvp_toolcalls *o, const char *s, size_t from, size_t to, int trim)
{
    if (trim) {
        while (from < to && ws(s[from]))
            from++;
        while (to > from && ws(s[to - 1]))
            to--;
    }
    if (to > from && o->n_content < KVP_TOOLCALL_MAX + 1)
        o->content[o->n_content++] = (kvp_range){from, to};
}

/* The start of the longest suffix of s[from..n) that begins `marker`, or n. */
static size_t partial_marker(const char *s, size_t from, size_t n, const char *marker)
{
    size_t m = strlen(marker);
    for (size_t k = m - 1; k > 0; k--)
        if (n - from >= k && !memcmp(s + n - k, marker, k))
            return n - k;
    return n;
}

static int hermes(const char *s, size_t n, int final, kvp_toolcalls *o)
{
    size_t pos = 0, ol = strlen(HERMES_OPEN), cl = strlen(HERMES_CLOSE);
    for (;;) {
        const char *hit = memmem(s + pos, n - pos, HERMES_OPEN, ol);
        if (!hit) {
            size_t keep = final ? n : partial_marker(s, pos, n, HERMES_OPEN);
            while (!final && keep > pos && ws(s[keep - 1]))
                keep--;   /* a newline before a call is the format's, not content */
            content(o, s, pos, keep, o->n > 0);
            o->held = keep;
            return o->n;
        }
        size_t at = (size_t)(hit - s), j = at + ol;
        size_t v = kvp_json_value_end(s + j, n - j);
        kvp_toolcall c;
        int ok = v && o->n < KVP_TOOLCALL_MAX && call_of(s, j, j + v, "arguments", "parameters", &c) == 0;
        size_t after = ok ? skip_ws(s, n, j + v) : 0;
        int closed = ok && n - after >= cl && !memcmp(s + after, HERMES_CLOSE, cl);
        int maybe = ok && !closed && !memcmp(s + after, HERMES_CLOSE, n - after < cl ? n - after : cl);
        if (!final && (!v || maybe)) {   /* still being written */
            content(o, s, pos, at, 1);
            while (at > pos && ws(s[at - 1]))
                at--;
            o->held = at;
            return o->n;
        }
        if (!ok || (!closed && after < n)) {   /* not a call: the rest is content */
            o->broken = 1;
            content(o, s, pos, n, o->n > 0);
            o->held = n;
            return o->n;
        }
        content(o, s, pos, at, 1);
        o->call[o->n++] = c;
        pos = closed ? after + cl : n;   /* final and unclosed: a whole call still */
    }
}

static int llama3(const char *s, size_t n, int final, kvp_toolcalls *o)
{
    size_t i = skip_ws(s, n, 0), tl = strlen(PYTHON_TAG);
    if (!final && i == n) {
        o->held = 0;
        return 0;
    }
    if (n - i >= tl && !memcmp(s + i, PYTHON_TAG, tl))
        i = skip_ws(s, n, i + tl);
    else if (!final && n - i < tl && !memcmp(s + i, PYTHON_TAG, n - i))
        return o->held = 0, 0;
    for (;;) {
        if (i >= n) {
            if (!final)
                o->held = 0, o->n = 0;
            else
                o->held = n;
            return o->n;
        }
        if (s[i] != '{')
            break;
        size_t v = kvp_json_value_end(s + i, n - i);
        kvp_toolcall c;
        if (!v && !final) {
            o->held = 0, o->n = 0;   /* a reply that opens with a call: held whole */
            return 0;
        }
        if (!v || o->n >= KVP_TOOLCALL_MAX || call_of(s, i, i + v, "parameters", "arguments", &c)) {
            if (o->n == 0)
                break;
            o->broken = 1;
            content(o, s, i, n, 1);
            o->held = n;
            return o->n;
        }
        o->call[o->n++] = c;
        i = skip_ws(s, n, i + v);
        if (i < n && s[i] == ';')
            i = skip_ws(s, n, i + 1);
    }
    if (o->n == 0) {   /* not a call: all of it is content */
        o->n_content = 0;
        content(o, s, 0, n, 0);
    } else {
        content(o, s, i, n, 1);
    }
    o->held = n;
    return o->n;
}

static int mistral(const char *s, size_t n, int final, kvp_toolcalls *o)
{
    size_t ml = strlen(MISTRAL_OPEN);
    const char *hit = memmem(s, n, MISTRAL_OPEN, ml);
    if (!hit) {
        size_t keep = final ? n : partial_marker(s, 0, n, MISTRAL_OPEN);
        content(o, s, 0, keep, 0);
        o->held = keep;
        return 0;
    }
    size_t at = (size_t)(hit - s), j = skip_ws(s, n, at + ml);
    size_t v = j < n && s[j] == '[' ? kvp_json_value_end(s + j, n - j) : 0;
    if (!v && !final && (j == n || s[j] == '[')) {
        content(o, s, 0, at, 1);
        o->held = at;
        return 0;
    }
    kvp_toolcall c[KVP_TOOLCALL_MAX];
    int k = 0, ok = v > 0;
    size_t i = j + 1, end = j + v;
    while (ok && (i = skip_ws(s, end, i)) < end - 1) {
        if (s[i] == ',') {
            i++;
            continue;
        }
        size_t e = value_at(s, end, i, 1);
        ok = e && k < KVP_TOOLCALL_MAX && call_of(s, i, e, "arguments", "parameters", &c[k]) == 0;
        k += ok;
        i = e;
    }
    if (!ok || k == 0) {
        o->broken = 1;
        content(o, s, 0, n, 0);
        o->held = n;
        return 0;
    }
    content(o, s, 0, at, 1);
    memcpy(o->call, c, sizeof c[0] * (size_t)k);
    o->n = k;
    content(o, s, end, n, 1);
    o->held = n;
    return k;
}

int kvp_toolcall_parse(enum kvp_tool_format f, const char *text, size_t len, int final,
                       kvp_toolcalls *out)
{
    memset(out, 0, sizeof *out);
    out->held = len;
    switch (f) {
    case KVP_TOOLS_HERMES: return hermes(text, len, final, out);
    case KVP_TOOLS_LLAMA3: return llama3(text, len, final, out);
    case KVP_TOOLS_MISTRAL: return mistral(text, len, final, out);
    default:
        content(out, text, 0, len, 0);
        return 0;
    }
}

/* ---- writing calls ---- */

int kvp_toolcall_opening(enum kvp_tool_format f, const char *name, int empty_args, char *buf,
                         size_t cap)
{
    if (!name || !kvp_toolcall_name_ok(name, strlen(name)))
        return -1;
    int n;
    switch (f) {
    case KVP_TOOLS_HERMES:
        n = snprintf(buf, cap, "%s\n{\"name\": \"%s\", \"arguments\": %s", HERMES_OPEN, name,
                     empty_args ? "{}}\n</tool_call>" : "");
        break;
    case KVP_TOOLS_LLAMA3:
        n = snprintf(buf, cap, "{\"name\": \"%s\", \"parameters\": %s", name,
                     empty_args ? "{}}" : "");
        break;
    case KVP_TOOLS_MISTRAL:
        n = snprintf(buf, cap, "%s[{\"name\": \"%s\", \"arguments\": %s", MISTRAL_OPEN, name,
                     empty_args ? "{}}]" : "");
        break;
    default:
        return -1;
    }
    return n < 0 || (size_t)n >= cap ? -1 : n;
}

const char *kvp_toolcall_close(enum kvp_tool_format f)
{
    return f == KVP_TOOLS_HERMES ? HERMES_CLOSE : "";
}

int kvp_toolcall_frame(enum kvp_tool_format f, kvp_toolcall_shape *out)
{
    switch (f) {
    case KVP_TOOLS_HERMES:
        *out = (kvp_toolcall_shape){"<tool_call>\n", "arguments", "\n</tool_call>"};
        return 0;
    case KVP_TOOLS_LLAMA3:
        *out = (kvp_toolcall_shape){"", "parameters", ""};
        return 0;
    case KVP_TOOLS_MISTRAL:
        *out = (kvp_toolcall_shape){"[TOOL_CALLS][", "arguments", "]"};
        return 0;
    default:
        *out = (kvp_toolcall_shape){"", "", ""};
        return -1;
    }
}

static int put(char **buf, size_t *len, const char *s, size_t n)
{
    char *b = realloc(*buf, *len + n + 1);
    if (!b)
        return -1;
    memcpy(b + *len, s, n);
    *len += n;
    b[*len] = '\0';
    *buf = b;
    return 0;
}

static int puts_(char **buf, size_t *len, const char *s)
{
    return put(buf, len, s, strlen(s));
}

int kvp_toolcall_write(enum kvp_tool_format f, const char *name, size_t name_len,
                       const char *args, size_t args_len, int sep, char **buf, size_t *len)
{
    if (!args_len) {
        args = "{}";
        args_len = 2;
    }
    int rc = 0;
    switch (f) {
    case KVP_TOOLS_HERMES:
        rc |= puts_(buf, len, sep ? "\n<tool_call>\n{\"name\": \"" : "<tool_call>\n{\"name\": \"");
        rc |= put(buf, len, name, name_len);
        rc |= puts_(buf, len, "\", \"arguments\": ");
        rc |= put(buf, len, args, args_len);
        rc |= puts_(buf, len, "}\n</tool_call>");
        break;
    case KVP_TOOLS_LLAMA3:
        rc |= puts_(buf, len, sep ? "; {\"name\": \"" : "{\"name\": \"");
        rc |= put(buf, len, name, name_len);
        rc |= puts_(buf, len, "\", \"parameters\": ");
        rc |= put(buf, len, args, args_len);
        rc |= puts_(buf, len, "}");
        break;
    case KVP_TOOLS_MISTRAL:
        if (sep && *len && (*buf)[*len - 1] == ']') {
            (*len)--;   /* one array: the next call goes inside it */
            rc |= puts_(buf, len, ", {\"name\": \"");
        } else {
            rc |= puts_(buf, len, "[TOOL_CALLS][{\"name\": \"");
        }
        rc |= put(buf, len, name, name_len);
        rc |= puts_(buf, len, "\", \"arguments\": ");
        rc |= put(buf, len, args, args_len);
        rc |= puts_(buf, len, "}]");
        break;
    default:
        return -1;
    }
    return rc ? -1 : 0;
}
