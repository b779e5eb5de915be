/* Chat templates rendered to token ids. Each format is four pieces of its Jinja template:
 * begin (conversation start, system prompt), user (a user message and the generation
 * prompt), the reply's body as the template prints it, and what follows a reply (its
 * end marker and separator). A turn is close-previous-reply + user; a from-scratch
 * rendering is begin + (user + body + close)*. Text between two special tokens is
 * collected and encoded as one run; SentencePiece gives every run that starts after a
 * special token (or the conversation) its dummy leading space, as HF and llama.cpp do. */
#include "model/template.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/reasoning.h"
#include "model/template_impl.h"
#include "model/tokenizer.h"

static const struct { const char *name; enum kvp_chat_format f; } names[] = {
    {"plain", KVP_CHAT_PLAIN},   {"chatml", KVP_CHAT_CHATML}, {"llama2", KVP_CHAT_LLAMA2},
    {"llama3", KVP_CHAT_LLAMA3}, {"mistral", KVP_CHAT_MISTRAL}, {"zephyr", KVP_CHAT_ZEPHYR},
    {"phi3", KVP_CHAT_PHI3},     {"gemma", KVP_CHAT_GEMMA},
};
#define N_NAMES (sizeof names / sizeof names[0])

const char *kvp_template_name(enum kvp_chat_format f)
{
    for (size_t i = 0; i < N_NAMES; i++)
        if (names[i].f == f)
            return names[i].name;
    return "plain";
}

int kvp_template_format(const char *name)
{
    for (size_t i = 0; i < N_NAMES; i++)
        if (!strcmp(names[i].name, name))
            return (int)names[i].f;
    return -1;
}

static int has(const char *s, size_t n, const char *needle)
{
    return memmem(s, n, needle, strlen(needle)) != NULL;
}

int kvp_template_detect(const char *s, size_t n)
{
    if (has(s, n, "<|im_start|>"))
        return KVP_CHAT_CHATML;
    if (has(s, n, "<|start_header_id|>"))
        return KVP_CHAT_LLAMA3;
    if (has(s, n, "<start_of_turn>"))
        return KVP_CHAT_GEMMA;
    if (has(s, n, "<|user|>"))
        return has(s, n, "<|end|>") ? KVP_CHAT_PHI3 : KVP_CHAT_ZEPHYR;
    if (has(s, n, "[INST]"))
        return has(s, n, "<<SYS>>") ? KVP_CHAT_LLAMA2 : KVP_CHAT_MISTRAL;
    return -1;
}

/* The system prompt a ChatML template writes when the conversation has none, as in
 * Qwen 2.5's '<|im_start|>system\nYou are Qwen, ...<|im_end|>\n' literal. */
static void default_system(char *out, size_t cap, const char *s, size_t n)
{
    static const char open[] = "<|im_start|>system\\n";
    out[0] = 0;
    for (const char *p = s; (p = memmem(p, (size_t)(s + n - p), open, sizeof open - 1));) {
        p += sizeof open - 1;
        const char *end = memmem(p, (size_t)(s + n - p), "<|im_end|>", 10);
        if (!end || (size_t)(end - p) >= cap)
            return;
        /* A literal only: no Jinja expression, quote or escape inside. */
        const char *q = p;
        while (q < end && !strchr("'\"{}\\+", *q))
            q++;
        if (q == end) {
            memcpy(out, p, (size_t)(end - p));
            out[end - p] = 0;
            return;
        }
    }
}



static int marker(const kvp_tokenizer *tok, const char *piece)
{
    return kvp_tokenizer_lookup(tok, piece, strlen(piece));
}

static int special(const kvp_tokenizer *tok, const char *piece)
{
    return kvp_tokenizer_special(tok, piece, strlen(piece));
}

/* Marker ids are recomputed from the vocabulary (cheap lookups), so the template struct
 * stays plain data. */
static tpl_priv markers(const kvp_template *t)
{
    tpl_priv p;
    for (int i = 0; i < N_MK; i++)
        p.mk[i] = -1;
    const kvp_tokenizer *tok = t->tok;
    switch (t->format) {
    case KVP_CHAT_CHATML:
        p.mk[MK_OPEN] = marker(tok, "<|im_start|>");
        p.mk[MK_CLOSE] = marker(tok, "<|im_end|>");
        break;
    case KVP_CHAT_LLAMA3:
        p.mk[MK_OPEN] = marker(tok, "<|start_header_id|>");
        p.mk[MK_CLOSE] = marker(tok, "<|end_header_id|>");
        p.mk[MK_EOT] = marker(tok, "<|eot_id|>");
        break;
    case KVP_CHAT_GEMMA:
        p.mk[MK_OPEN] = marker(tok, "<start_of_turn>");
        p.mk[MK_CLOSE] = marker(tok, "<end_of_turn>");
        break;
    case KVP_CHAT_PHI3:
    case KVP_CHAT_ZEPHYR:
        if (t->format == KVP_CHAT_PHI3)
            p.mk[MK_END] = marker(tok, "<|end|>");
        /* role markers: text in TinyLlama's vocabulary, special tokens in Phi-3's */
        p.mk[MK_SYSTEM] = special(tok, "<|system|>");
        p.mk[MK_USER] = special(tok, "<|user|>");
        p.mk[MK_ASSISTANT] = special(tok, "<|assistant|>");
        break;
    default:
        break;
    }
    return p;
}

/* The marker that ends a reply and is kept in the transcript, -1 for plain. */
static int end_marker(const kvp_template *t, const tpl_priv *p)
{
    switch (t->format) {
    case KVP_CHAT_CHATML: return p->mk[MK_CLOSE];
    case KVP_CHAT_LLAMA3: return p->mk[MK_EOT];
    case KVP_CHAT_GEMMA: return p->mk[MK_CLOSE];
    case KVP_CHAT_PHI3: return p->mk[MK_END];
    case KVP_CHAT_LLAMA2: case KVP_CHAT_MISTRAL: case KVP_CHAT_ZEPHYR: return t->eos;
    default: return -1;
    }
}

int kvp_template_init(kvp_template *t, const kvp_model *m, const char *name, char *note,
                      size_t notelen)
{
    memset(t, 0, sizeof *t);
    t->tok = &m->tok;
    t->bos = m->tok.bos_id;
    t->eos = m->tok.eos_id;
    t->stop[0] = t->stop[1] = t->stop[2] = -1;
    if (note && notelen)
        note[0] = 0;
    const char *tmpl = m->chat_template ? m->chat_template : "";
    size_t tlen = strlen(tmpl);
    int fell_back = 0;
    if (name && name[0]) {
        int f = kvp_template_format(name);
        if (f < 0) {
            if (note && notelen)
                snprintf(note, notelen, "unknown chat_template '%s' (plain, chatml, llama2, "
                         "llama3, mistral, zephyr, phi3, gemma)", name);
            return -EINVAL;
        }
        t->format = (enum kvp_chat_format)f;
    } else if (tlen == 0) {
        t->format = KVP_CHAT_PLAIN;
    } else {
        int f = kvp_template_detect(tmpl, tlen);
        if (f < 0) {
            f = KVP_CHAT_CHATML;
            fell_back = 1;
            if (note && notelen)
                snprintf(note, notelen, "tokenizer.chat_template is of no known family: "
                         "using chatml");
        }
        t->format = (enum kvp_chat_format)f;
    }
    if (t->format == KVP_CHAT_CHATML)
        default_system(t->default_system, sizeof t->default_system, tmpl, tlen);
    if (t->format == KVP_CHAT_LLAMA3)
        t->dated_system = has(tmpl, tlen, "Cutting Knowledge Date");

    tpl_priv p = markers(t);
    int ok = 1;
    switch (t->format) {
    case KVP_CHAT_CHATML: case KVP_CHAT_GEMMA:
        ok = p.mk[MK_OPEN] >= 0 && p.mk[MK_CLOSE] >= 0;
        break;
    case KVP_CHAT_LLAMA3:
        ok = p.mk[MK_OPEN] >= 0 && p.mk[MK_CLOSE] >= 0 && p.mk[MK_EOT] >= 0;
        break;
    case KVP_CHAT_PHI3:
        ok = p.mk[MK_END] >= 0;
        break;
    case KVP_CHAT_LLAMA2: case KVP_CHAT_MISTRAL:
        ok = t->bos >= 0 && t->eos >= 0;
        break;
    case KVP_CHAT_ZEPHYR:
        ok = t->eos >= 0;
        break;
    default:
        break;
    }
    if (!ok) {
        if (note && notelen)
            snprintf(note, notelen, "the vocabulary lacks the %s markers: plain text",
                     kvp_template_name(t->format));
        t->format = KVP_CHAT_PLAIN;
        fell_back = 1;
    }
    /* a chat model whose vocabulary holds both markers may open a reply with its
     * reasoning (Qwen3, QwQ, DeepSeek-R1) */
    t->think = t->format != KVP_CHAT_PLAIN &&
               kvp_tokenizer_lookup(t->tok, KVP_THINK_OPEN, strlen(KVP_THINK_OPEN)) >= 0 &&
               kvp_tokenizer_lookup(t->tok, KVP_THINK_CLOSE, strlen(KVP_THINK_CLOSE)) >= 0;
    if (t->format == KVP_CHAT_PLAIN) {
        /* Base models end a text with EOS, llama2.c stories with BOS. */
        t->stop[0] = t->eos;
        t->stop[1] = t->bos;
    } else {
        t->stop[0] = end_marker(t, &p);
        if (t->eos != t->stop[0])
            t->stop[1] = t->eos;
    }
    /* the end-of-turn token the file declares ends a reply in every format */
    if (m->tok.eot_id != t->stop[0] && m->tok.eot_id != t->stop[1])
        t->stop[2] = m->tok.eot_id;
    /* Detecting: the model's own template renders, the family stays for what the
     * interpreter refuses (the note names the construct). */
    if (!(name && name[0]) && tlen) {
        char why[200];
        if (kvp_template_use_jinja(t, tmpl, tlen, why, sizeof why) < 0) {
            if (note && notelen) {
                size_t at = strlen(note);
                snprintf(note + at, notelen - at, "%stokenizer.chat_template: %s; the %s "
                         "family renders", at ? "; " : "", why, kvp_template_name(t->format));
            }
            fell_back = 1;
        }
    }
    return fell_back;
}

/* ---- rendering ---- */

/* Room for `need` more tokens (doubling). */
static int reserve(render *r, size_t need)
{
    if (need > (size_t)(1 << 28))
        return -E2BIG;
    while ((size_t)(r->cap - r->n) < need) {
        int cap = r->cap ? r->cap * 2 : 64;
        int *v = realloc(r->v, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        r->v = v;
        r->cap = cap;
    }
    return 0;
}

void kvp_tpl_txt(render *r, const char *s, size_t len)
{
    if (r->rc || !len)
        return;
    if (r->tn + len > r->tcap) {
        size_t cap = r->tcap ? r->tcap : 256;
        while (cap < r->tn + len)
            cap *= 2;
        char *nt = realloc(r->text, cap);
        if (!nt) {
            r->rc = -ENOMEM;
            return;
        }
        r->text = nt;
        r->tcap = cap;
    }
    memcpy(r->text + r->tn, s, len);
    r->tn += len;
}

#define LIT(r, s) kvp_tpl_txt(r, s, sizeof(s) - 1)

/* Encodes the pending run. */
static void flush(render *r)
{
    if (r->rc || !r->tn)
        return;
    /* A token covers at least a byte; NFC (Qwen) may lengthen text up to 4x. */
    for (size_t room = r->tn + 2;; room = 4 * r->tn + 2) {
        if ((r->rc = reserve(r, room)))
            return;
        int n = kvp_tokenizer_encode(r->t->tok, r->text, r->tn,
                                     r->run_start ? 0 : KVP_ENCODE_NO_PREFIX, r->v + r->n,
                                     r->cap - r->n);
        if (n == -ENOSPC && room < 4 * r->tn + 2)
            continue;
        if (n < 0) {
            r->rc = n;
            return;
        }
        r->n += n;
        break;
    }
    r->tn = 0;
    r->run_start = 0;
}

void kvp_tpl_tok(render *r, int id)
{
    flush(r);
    if (r->rc || id < 0)
        return;
    if ((r->rc = reserve(r, 1)))
        return;
    r->v[r->n++] = id;
    r->run_start = 1;
}

/* A marker: its special token when the vocabulary has one, else its text. */
static void mark(render *r, int id, const char *s)
{
    if (id >= 0)
        kvp_tpl_tok(r, id);
    else
        kvp_tpl_txt(r, s, strlen(s));
}

static int is_space(char c)
{
    return c == ' ' || (c >= '\t' && c <= '\r');
}

/* Jinja's trim / Python's strip (ASCII white space). */
static void trim(const char **s, size_t *len)
{
    while (*len && is_space((*s)[0]))
        (*s)++, (*len)--;
    while (*len && is_space((*s)[*len - 1]))
        (*len)--;
}

/* Conversation start: BOS and the system block of the formats that have one. */
static void begin(render *r, const char *sys, size_t sl)
{
    const kvp_template *t = r->t;
    const int *mk = r->p.mk;
    switch (t->format) {
    case KVP_CHAT_CHATML:
        if (!sl) {
            sys = t->default_system;
            sl = strlen(sys);
        }
        if (sl) {
            kvp_tpl_tok(r, mk[MK_OPEN]);
            LIT(r, "system\n");
            kvp_tpl_txt(r, sys, sl);
            kvp_tpl_tok(r, mk[MK_CLOSE]);
            LIT(r, "\n");
        }
        break;
    case KVP_CHAT_LLAMA3:
        kvp_tpl_tok(r, t->bos);
        if (sl || t->dated_system) {
            kvp_tpl_tok(r, mk[MK_OPEN]);
            LIT(r, "system");
            kvp_tpl_tok(r, mk[MK_CLOSE]);
            LIT(r, "\n\n");
            /* Llama 3.1+'s template, with the date it uses when none is passed in */
            if (t->dated_system)
                LIT(r, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
            trim(&sys, &sl);
            kvp_tpl_txt(r, sys, sl);
            kvp_tpl_tok(r, mk[MK_EOT]);
        }
        break;
    case KVP_CHAT_ZEPHYR:
    case KVP_CHAT_PHI3:
        if (sl) {
            mark(r, mk[MK_SYSTEM], "<|system|>");
            LIT(r, "\n");
            kvp_tpl_txt(r, sys, sl);
            if (t->format == KVP_CHAT_ZEPHYR)
                kvp_tpl_tok(r, t->eos);
            else
                kvp_tpl_tok(r, mk[MK_END]);
            LIT(r, "\n");
        }
        break;
    case KVP_CHAT_MISTRAL:
    case KVP_CHAT_GEMMA:
        kvp_tpl_tok(r, t->bos);
        break;
    default:   /* Llama 2: BOS opens every user turn; plain: BOS opens the text */
        break;
    }
}

/* A user message and the generation prompt. The system prompt is passed for the
 * formats that fold it into the first user message (Llama 2, Mistral, Gemma). */
static void user(render *r, int first, const char *sys, size_t sl, const char *u, size_t ul)
{
    const kvp_template *t = r->t;
    const int *mk = r->p.mk;
    if (!first)
        sl = 0;
    switch (t->format) {
    case KVP_CHAT_CHATML:
        kvp_tpl_tok(r, mk[MK_OPEN]);
        LIT(r, "user\n");
        kvp_tpl_txt(r, u, ul);
        kvp_tpl_tok(r, mk[MK_CLOSE]);
        LIT(r, "\n");
        kvp_tpl_tok(r, mk[MK_OPEN]);
        LIT(r, "assistant\n");
        break;
    case KVP_CHAT_LLAMA3:
        kvp_tpl_tok(r, mk[MK_OPEN]);
        LIT(r, "user");
        kvp_tpl_tok(r, mk[MK_CLOSE]);
        LIT(r, "\n\n");
        trim(&u, &ul);
        kvp_tpl_txt(r, u, ul);
        kvp_tpl_tok(r, mk[MK_EOT]);
        kvp_tpl_tok(r, mk[MK_OPEN]);
        LIT(r, "assistant");
        kvp_tpl_tok(r, mk[MK_CLOSE]);
        LIT(r, "\n\n");
        break;
    case KVP_CHAT_LLAMA2: {
        /* '[INST] ' + ('<<SYS>>\n' + system + '\n<</SYS>>\n\n' + content).strip() + ' [/INST]' */
        kvp_tpl_tok(r, t->bos);
        LIT(r, "[INST] ");
        if (sl) {
            /* the strip() touches only the message's end: the block opens the text */
            LIT(r, "<<SYS>>\n");
            kvp_tpl_txt(r, sys, sl);
            LIT(r, "\n<</SYS>>\n\n");
            while (ul && is_space(u[ul - 1]))
                ul--;
        } else {
            trim(&u, &ul);
        }
        kvp_tpl_txt(r, u, ul);
        LIT(r, " [/INST]");
        break;
    }
    case KVP_CHAT_MISTRAL:
        LIT(r, "[INST] ");
        if (sl) {
            kvp_tpl_txt(r, sys, sl);
            LIT(r, "\n\n");
        }
        kvp_tpl_txt(r, u, ul);
        LIT(r, " [/INST]");
        break;
    case KVP_CHAT_ZEPHYR:
        mark(r, mk[MK_USER], "<|user|>");
        LIT(r, "\n");
        kvp_tpl_txt(r, u, ul);
        kvp_tpl_tok(r, t->eos);
        LIT(r, "\n");
        mark(r, mk[MK_ASSISTANT], "<|assistant|>");
        LIT(r, "\n");
        break;
    case KVP_CHAT_PHI3:
        mark(r, mk[MK_USER], "<|user|>");
        LIT(r, "\n");
        kvp_tpl_txt(r, u, ul);
        kvp_tpl_tok(r, mk[MK_END]);
        LIT(r, "\n");
        mark(r, mk[MK_ASSISTANT], "<|assistant|>");
        LIT(r, "\n");
        break;
    case KVP_CHAT_GEMMA:
        kvp_tpl_tok(r, mk[MK_OPEN]);
        LIT(r, "user\n");
        if (sl) {
            kvp_tpl_txt(r, sys, sl);
            LIT(r, "\n\n");
        }
        trim(&u, &ul);
        kvp_tpl_txt(r, u, ul);
        kvp_tpl_tok(r, mk[MK_CLOSE]);
        LIT(r, "\n");
        kvp_tpl_tok(r, mk[MK_OPEN]);
        LIT(r, "model\n");
        break;
    default:
        /* Plain continuation: the user's text simply extends the document. */
        if (first)
            kvp_tpl_tok(r, t->bos);
        r->run_start = 1;
        kvp_tpl_txt(r, u, ul);
        break;
    }
}

/* What follows a reply's text. how: 0 the reply ended with its (kept) stop token,
 * 1 it was cut (the end marker goes in), 2 rendering from scratch. */
static void close_reply(render *r, int how)
{
    const kvp_template *t = r->t;
    int end = end_marker(t, &r->p);
    if (t->format == KVP_CHAT_PLAIN)
        return;
    if (t->format == KVP_CHAT_LLAMA2 && how == 2)
        LIT(r, " ");   /* ' ' + content.strip() + ' ' + eos_token */
    if (how)
        kvp_tpl_tok(r, end);
    switch (t->format) {
    case KVP_CHAT_CHATML: case KVP_CHAT_ZEPHYR: case KVP_CHAT_PHI3: case KVP_CHAT_GEMMA:
        LIT(r, "\n");
        break;
    default:
        break;
    }
}

/* A reply's text as the template prints it (rendering from scratch). */
static void reply_body(render *r, const char *a, size_t al)
{
    switch (r->t->format) {
    case KVP_CHAT_LLAMA2:
        trim(&a, &al);
        LIT(r, " ");
        break;
    case KVP_CHAT_LLAMA3: case KVP_CHAT_GEMMA:
        trim(&a, &al);
        break;
    default:
        break;
    }
    kvp_tpl_txt(r, a, al);
}

int kvp_tpl_finish(render *r, int **out)
{
    flush(r);
    free(r->text);
    if (r->rc) {
        free(r->v);
        return r->rc;
    }
    *out = r->v;
    return r->n;
}

void kvp_tpl_start(render *r, const kvp_template *t)
{
    memset(r, 0, sizeof *r);
    r->t = t;
    r->p = markers(t);
    r->run_start = 1;
}

int kvp_template_turn(const kvp_template *t, const char *system, size_t system_len,
                      int first, int reply_open, const char *text, size_t len, int **out)
{
    render r;
    kvp_tpl_start(&r, t);
    if (first)
        begin(&r, system, system_len);
    else
        close_reply(&r, reply_open ? 1 : 0);
    user(&r, first, system, system_len, text, len);
    return kvp_tpl_finish(&r, out);
}

int kvp_template_reply(const kvp_template *t, const char *text, size_t len, int **out)
{
    render r;
    kvp_tpl_start(&r, t);
    /* Reply pieces carry their own leading spaces: no dummy prefix. */
    r.run_start = 0;
    kvp_tpl_txt(&r, text, len);
    return kvp_tpl_finish(&r, out);
}

int kvp_template_render(const kvp_template *t, const char *system, size_t system_len,
                        const kvp_chat_msg *msgs, int n, int **out)
{
    if (t->jinja)
        return kvp_template_render_jinja(t, system, system_len, msgs, n, out, NULL, 0);
    render r;
    kvp_tpl_start(&r, t);
    begin(&r, system, system_len);
    for (int i = 0; i < n; i++) {
        if (msgs[i].user != !(i % 2)) {
            free(r.v);
            free(r.text);
            return -EINVAL;   /* user and assistant alternate, user first */
        }
        if (msgs[i].user) {
            user(&r, i == 0, system, system_len, msgs[i].text, msgs[i].len);
        } else {
            reply_body(&r, msgs[i].text, msgs[i].len);
            close_reply(&r, 2);
        }
    }
    return kvp_tpl_finish(&r, out);
}

int kvp_template_is_stop(const kvp_template *t, int tok)
{
    for (int i = 0; i < 3; i++)
        if (t->stop[i] >= 0 && t->stop[i] == tok)
            return 1;
    return 0;
}

int kvp_template_keeps_stop(const kvp_template *t)
{
    return t->format != KVP_CHAT_PLAIN;
}
