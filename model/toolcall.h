/* Tool calls in a model's reply: which format a chat template's family emits, and a pure
 * parser that splits a reply's text into its content and its calls (docs/openai.md).
 *
 * Formats:
 *   HERMES   (Qwen 2.5/3, Hermes, ChatML templates):  <tool_call>\n{"name": N,
 *            "arguments": {...}}\n</tool_call>, several in a row; text outside is content.
 *   LLAMA3   (Llama 3.1+):  the reply is one JSON call {"name": N, "parameters": {...}}
 *            ("arguments" is taken too), optionally after <|python_tag|>; several
 *            separated by ';' or newlines. A reply that does not start with one is
 *            content.
 *   MISTRAL  (Mistral v3+):  [TOOL_CALLS][{"name": N, "arguments": {...}}, ...]; text
 *            before the marker is content.
 * Arguments come out as the JSON text the model wrote (an object), unchanged: rendering
 * them back as a string gives the same bytes, so a client that sends the call back
 * continues the same transcript.
 *
 * The parser never allocates for content: content is a list of [from, to) ranges of the
 * text (at most KVP_TOOLCALL_MAX + 1 of them), names and arguments are ranges too. */
#ifndef KVP_TOOLCALL_H
#define KVP_TOOLCALL_H

#include <stddef.h>

enum kvp_tool_format { KVP_TOOLS_NONE = 0, KVP_TOOLS_HERMES, KVP_TOOLS_LLAMA3, KVP_TOOLS_MISTRAL };

/* Calls in one reply, at most. */
#define KVP_TOOLCALL_MAX 32
/* Bytes of a function name (OpenAI's rule: [A-Za-z0-9_-]{1,64}). */
#define KVP_TOOLCALL_NAME_MAX 64

typedef struct kvp_range {
    size_t from, to;
} kvp_range;

typedef struct kvp_toolcall {
    kvp_range name;       /* the name's bytes inside its JSON string (no escapes allowed) */
    kvp_range args;       /* the arguments' JSON text (an object) */
} kvp_toolcall;

typedef struct kvp_toolcalls {
    kvp_toolcall call[KVP_TOOLCALL_MAX];
    int n;
    kvp_range content[KVP_TOOLCALL_MAX + 1];   /* the text outside the calls, in order */
    int n_content;
    /* Not final: bytes from `held` on may still become (or are inside) a call, so they
     * are neither content nor a call yet; equals len when nothing is held. Final: len. */
    size_t held;
    /* Final: a call was opened and never closed or not valid JSON (its text is content). */
    int broken;
} kvp_toolcalls;

/* The format of a chat template: by its text when it names a format's markers
 * (<tool_call>: HERMES, [TOOL_CALLS]: MISTRAL, <|python_tag|> or an ipython role: LLAMA3),
 * else by family name ("chatml": HERMES, "llama3": LLAMA3, "mistral": MISTRAL), else
 * NONE. tmpl may be NULL. */
enum kvp_tool_format kvp_toolcall_detect(const char *tmpl, size_t len, const char *family);
const char *kvp_toolcall_format_name(enum kvp_tool_format f);

/* Splits text[0..len) into content and calls. final: the reply is whole (an unclosed
 * call is content, broken set); else the bytes that may still be a call are held.
 * Returns the number of calls. */
int kvp_toolcall_parse(enum kvp_tool_format f, const char *text, size_t len, int final,
                       kvp_toolcalls *out);

/* The text a format's reply opens a call of `name` with, so the model goes on with the
 * arguments (empty_args: the whole call with "{}" as its arguments, closed). Writes at
 * most cap bytes with a NUL; returns the length, or -1 (no format, a bad name, no room). */
int kvp_toolcall_opening(enum kvp_tool_format f, const char *name, int empty_args, char *buf,
                         size_t cap);
/* The marker that closes one call ("</tool_call>" for HERMES), "" when the format has
 * none. */
const char *kvp_toolcall_close(enum kvp_tool_format f);

/* The text around one call as kvpd writes a forced one: `open` the bytes before the call's
 * JSON object, `args_key` the key its arguments go under, `close` the bytes after it.
 * HERMES: "<tool_call>\n", "arguments", "\n</tool_call>"; LLAMA3: "", "parameters", "";
 * MISTRAL: "[TOOL_CALLS][", "arguments", "]". The object itself is
 * {"name": NAME, ARGS_KEY: {...}}. */
typedef struct kvp_toolcall_shape {
    const char *open, *args_key, *close;
} kvp_toolcall_shape;

/* f's shape into *out: 0, or -1 (KVP_TOOLS_NONE or unknown; *out is all ""). */
int kvp_toolcall_frame(enum kvp_tool_format f, kvp_toolcall_shape *out);

/* A call as the format writes it (as Qwen's template renders an assistant message's
 * tool_calls): HERMES `<tool_call>\n{"name": "N", "arguments": ARGS}\n</tool_call>`
 * (after a newline when sep), LLAMA3 `{"name": "N", "parameters": ARGS}` (after "; "
 * when sep), MISTRAL `[TOOL_CALLS][{"name": "N", "arguments": ARGS}]`. Appends to *buf
 * (malloc'd, grown; *len its length, NUL kept after it). 0, or -1 out of memory. */
int kvp_toolcall_write(enum kvp_tool_format f, const char *name, size_t name_len,
                       const char *args, size_t args_len, int sep, char **buf, size_t *len);

/* 1 when s[0..n) is a valid name ([A-Za-z0-9_-]{1,64}). */
int kvp_toolcall_name_ok(const char *s, size_t n);
/* The end of the JSON value starting at s[0] (leading whitespace skipped), or 0 when
 * s[0..n) does not hold a whole valid one. Depth is bounded (64). */
size_t kvp_json_value_end(const char *s, size_t n);

#endif
