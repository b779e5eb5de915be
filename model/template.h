/* Chat templates: the tokens that wrap each message so the model sees its own
 * conversation format, rendered as the model's tokenizer.chat_template (Jinja, as Hugging
 * Face's apply_chat_template runs it) would: ChatML (Qwen, SmolLM), Llama 3 headers,
 * Llama 2 and Mistral [INST], Zephyr (TinyLlama), Phi-3, Gemma; plain continuation for
 * base models (stories260K).
 * Markers are special tokens found by piece (a marker the vocabulary lacks as a special
 * token, such as Zephyr's "<|user|>" in TinyLlama, is text); the text between two special
 * tokens is encoded as one run, as HF tokenizes a rendered template. A message's text is
 * always encoded as text: "<|im_start|>" typed by a user is never a marker. */
#ifndef KVP_TEMPLATE_H
#define KVP_TEMPLATE_H

#include <stddef.h>
#include "model/model.h"
#include "model/toolcall.h"

enum kvp_chat_format {
    KVP_CHAT_PLAIN = 0, KVP_CHAT_CHATML, KVP_CHAT_LLAMA2, KVP_CHAT_LLAMA3, KVP_CHAT_MISTRAL,
    KVP_CHAT_ZEPHYR, KVP_CHAT_PHI3, KVP_CHAT_GEMMA,
};

typedef struct kvp_template {
    enum kvp_chat_format format;   /* the one in use */
    const kvp_tokenizer *tok;
    int bos, eos;
    int stop[3];                   /* tokens that end a reply, -1 unused */
    char default_system[256];      /* the system prompt the template adds when a
                                      conversation has none (Qwen 2.5, SmolLM2), or "" */
    int dated_system;              /* Llama 3.1+: the system block always opens with the
                                      knowledge cutoff and date lines */
    struct kvp_jinja *jinja;       /* the model's own chat template (model/jinja.h), NULL:
                                      the family renders; kvp_template_free frees it */
    int *specials;                 /* the special tokens a rendering may hold, longest
                                      piece first (jinja only) */
    int n_specials;
    enum kvp_tool_format tool_format;   /* how the Jinja template's model writes tool calls
                                           (kvp_toolcall_detect); NONE without one */
    int think;                     /* the vocabulary has both reasoning markers as tokens
                                      (model/reasoning.h): a reply may open with a block */
    int think_open;                /* think, and the Jinja template's generation prompt
                                      ends with an open `<think>` (Qwen3's thinking
                                      templates, DeepSeek-R1): a reply starts inside the
                                      block (kvp_reasoning_split_in) */
    int reasoning_var;             /* the Jinja template reads a message's
                                      reasoning_content: an assistant message's block is
                                      given to it there, the answer as its content */
} kvp_template;

/* A message's `user` for tool results: the client's side of a turn (as a user message),
 * its text a JSON array of {"tool_call_id", "name", "content"}, rendered by the Jinja
 * template as one tool message each (the families render the text as a user message). */
#define KVP_CHAT_TOOL 2

/* A message of a conversation, for kvp_template_render. */
typedef struct kvp_chat_msg {
    int user;                      /* 1: user, 0: assistant, KVP_CHAT_TOOL: tool results */
    const char *text;
    size_t len;
} kvp_chat_msg;

/* Picks the format: `name` when not NULL/empty (the config's chat_template = NAME), else
 * the family of the model's tokenizer.chat_template text; no template: plain. Returns 0,
 * 1 with a note (an unknown template falls back to ChatML; a format whose markers the
 * vocabulary lacks falls back to plain), or -EINVAL for an unknown name (note says so). */
int kvp_template_init(kvp_template *t, const kvp_model *m, const char *name, char *note,
                      size_t notelen);
/* Renders with a Jinja template instead of the family (the GGUF's tokenizer.chat_template,
 * which kvp_template_init takes when detecting, or a chat_template_file): parsed and
 * tried on a one-message conversation. 0, or -EINVAL with why in note (the line and
 * the construct) and the family left in charge. The family still gives the stop tokens. */
int kvp_template_use_jinja(kvp_template *t, const char *src, size_t len, char *note,
                           size_t notelen);
/* The Jinja rendering of a conversation: messages (a system message first when
 * system_len > 0), add_generation_prompt when the last is a user message, bos_token and
 * eos_token the vocabulary's pieces. Special tokens come only from the template's own
 * text and bos/eos: a message's "<|im_start|>" is text. The count, or a negative code
 * (-EINVAL: the template refused the conversation, why in err when err is not NULL). */
int kvp_template_render_jinja(const kvp_template *t, const char *system, size_t system_len,
                              const kvp_chat_msg *msgs, int n, int **out, char *err,
                              size_t errlen);
/* A session's next turn with the Jinja template: msgs is the whole conversation, the new
 * user message last; have[0..n_have) the transcript so far (replies as generated);
 * rendered: the transcript is this template's rendering of msgs but the last (as this
 * function built it). Sets *keep, how many of those tokens stand, and *out, the tokens
 * that follow them. When the rendering goes on from the previous one with the last reply's
 * text, *keep = n_have and *out is what follows the reply; when the template renders an
 * earlier turn differently now (Qwen3 drops an earlier reply's think block), or the
 * transcript was not rendered by it, *keep is the longest prefix the transcript shares
 * with the rendering from scratch. The count of *out, or -EINVAL when the template
 * refuses the conversation. */
int kvp_template_jinja_turn(const kvp_template *t, const char *system, size_t system_len,
                            const kvp_chat_msg *msgs, int n, const int *have, int n_have,
                            int rendered, int *keep, int **out);
/* As kvp_template_jinja_turn, with the request's tools (a JSON array, OpenAI's shape;
 * NULL/0: none) given to the template as `tools`. */
int kvp_template_jinja_turn_tools(const kvp_template *t, const char *system, size_t system_len,
                                  const kvp_chat_msg *msgs, int n, const char *tools,
                                  size_t tools_len, const int *have, int n_have, int rendered,
                                  int *keep, int **out);
/* An assistant prefill: msgs is the whole conversation with the assistant's unfinished
 * message last (non-empty), rendered without the generation prompt and cut where that
 * message's content ends, so the reply continues it; the cut is checked: the content
 * must be the last of the conversation's text the template renders, whole and verbatim.
 * have[0..n_have): the transcript so far. Sets *keep (how many of those tokens stand: the
 * longest prefix they share with the rendering), *out (the tokens that follow them) and
 * *content_at (the rendering's tokens before the content's first). The count of *out, or
 * -EINVAL with why in err (the template refuses the conversation, or does not render the
 * content verbatim), -ENOMEM. */
int kvp_template_jinja_prefill(const kvp_template *t, const char *system, size_t system_len,
                               const kvp_chat_msg *msgs, int n, const char *tools,
                               size_t tools_len, const int *have, int n_have, int *keep,
                               int *content_at, int **out, char *err, size_t errlen);
/* As kvp_template_render_jinja, with tools as above. */
int kvp_template_render_jinja_tools(const kvp_template *t, const char *system,
                                    size_t system_len, const kvp_chat_msg *msgs, int n,
                                    const char *tools, size_t tools_len, int **out, char *err,
                                    size_t errlen);
/* Text kvpd writes itself into a reply (a forced tool call's opening): tokenized with the
 * vocabulary's special tokens matched anywhere, as the template's own text is (Jinja
 * templates only; else as reply text). The count, or a negative code. */
int kvp_template_encode_trusted(const kvp_template *t, const char *text, size_t len, int **out);
void kvp_template_free(kvp_template *t);
const char *kvp_template_name(enum kvp_chat_format f);
/* The format of a name ("chatml", "llama3", ...), -1 if unknown. */
int kvp_template_format(const char *name);
/* The family a tokenizer.chat_template text renders, -1 if none is recognised. */
int kvp_template_detect(const char *tmpl, size_t len);

/* Tokens for one user turn, up to the start of the assistant's reply.
 * first: the conversation's first turn (system, len 0 for none, is rendered there);
 * reply_open: the previous reply ended without its end-of-turn marker (cut by
 * max_tokens or cancel), so the marker goes first. *out is malloc'd. Returns the count
 * or a negative code. */
int kvp_template_turn(const kvp_template *t, const char *system, size_t system_len,
                      int first, int reply_open, const char *text, size_t len, int **out);
/* Tokens for an assistant reply's text (rebuilding a transcript from its messages):
 * the text as the model would have generated it, without markers. */
int kvp_template_reply(const kvp_template *t, const char *text, size_t len, int **out);
/* The whole conversation from scratch with the generation prompt, as the model's
 * template renders it (its Jinja template when t->jinja is set) (replies closed by their end-of-turn markers). Where the format
 * is prefix-stable (all but Llama 2 / Mistral, whose template puts spaces around a
 * reply) this equals the transcript the turns build when every reply ends with its
 * stop token. */
int kvp_template_render(const kvp_template *t, const char *system, size_t system_len,
                        const kvp_chat_msg *msgs, int n, int **out);
/* 1 when `tok` ends a reply. */
int kvp_template_is_stop(const kvp_template *t, int tok);
/* 1 when a reply's stop token belongs in the transcript (the format's end marker). */
int kvp_template_keeps_stop(const kvp_template *t);

#endif
