/* Chat templates built from token ids: markers are looked up as whole pieces (the BPE
 * encoder would split "<|im_start|>"), text segments are encoded between them. */
#include "sessions/template.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "model/tokenizer.h"

const char *kvp_template_name(enum kvp_chat_format f)
{
    switch (f) {
    case KVP_CHAT_CHATML: return "chatml";
    case KVP_CHAT_LLAMA2: return "llama2";
    case KVP_CHAT_LLAMA3: return "llama3";
    default: return "plain";
    }
}

static int lookup(const kvp_tokenizer *tok, const char *piece)
{
    return kvp_tokenizer_lookup(tok, piece, strlen(piece));
}

int kvp_template_init(kvp_template *t, const kvp_model *m)
{
    memset(t, 0, sizeof *t);
    t->tok = &m->tok;
    t->bos = m->tok.bos_id;
    t->eos = m->tok.eos_id;
    t->open = t->close = t->eot = -1;
    t->stop[0] = t->stop[1] = t->stop[2] = -1;
    t->format = m->chat_format;
    switch (t->format) {
    case KVP_CHAT_CHATML:
        t->open = lookup(&m->tok, "<|im_start|>");
        t->close = lookup(&m->tok, "<|im_end|>");
        t->stop[0] = t->close;
        t->stop[1] = t->eos;
        if (t->open < 0 || t->close < 0)
            t->format = KVP_CHAT_PLAIN;
        break;
    case KVP_CHAT_LLAMA2:
        t->stop[0] = t->eos;
        if (t->bos < 0 || t->eos < 0)
            t->format = KVP_CHAT_PLAIN;
        break;
    case KVP_CHAT_LLAMA3:
        t->open = lookup(&m->tok, "<|start_header_id|>");
        t->close = lookup(&m->tok, "<|end_header_id|>");
        t->eot = lookup(&m->tok, "<|eot_id|>");
        t->stop[0] = t->eot;
        t->stop[1] = t->eos;
        if (t->open < 0 || t->close < 0 || t->eot < 0)
            t->format = KVP_CHAT_PLAIN;
        break;
    default:
        break;
    }
    if (t->format == KVP_CHAT_PLAIN) {
        /* Base models end a text with EOS, llama2.c stories with BOS. */
        t->stop[0] = t->eos;
        t->stop[1] = t->bos;
    }
    /* the end-of-turn token the file declares ends a reply in every format */
    t->stop[2] = m->tok.eot_id;
    return t->format != m->chat_format;
}

typedef struct tokbuf {
    int *v;
    int n, cap;
} tokbuf;

/* Room for `need` more tokens (doubling). */
static int reserve(tokbuf *b, int need)
{
    while (b->cap - b->n < need) {
        int cap = b->cap ? b->cap * 2 : 64;
        int *v = realloc(b->v, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        b->v = v;
        b->cap = cap;
    }
    return 0;
}

static int push(tokbuf *b, int id)
{
    if (id < 0)
        return 0;
    int rc = reserve(b, 1);
    if (rc)
        return rc;
    b->v[b->n++] = id;
    return 0;
}

/* Encodes text; space_prefix selects SentencePiece's dummy leading space. */
static int push_text(tokbuf *b, const kvp_tokenizer *tok, const char *s, size_t len,
                     int space_prefix)
{
    size_t need = len + 8;    /* at most one token per byte, plus the prefix */
    if (need > (size_t)(1 << 28))
        return -E2BIG;
    int rc = reserve(b, (int)need);
    if (rc)
        return rc;
    int n = kvp_tokenizer_encode(tok, s, len, space_prefix ? 0 : KVP_ENCODE_NO_PREFIX,
                                 b->v + b->n, b->cap - b->n);
    if (n < 0)
        return n;
    b->n += n;
    return 0;
}

#define LIT(s) s, sizeof(s) - 1

int kvp_template_turn(const kvp_template *t, int first, int reply_open,
                      const char *text, size_t len, int **out)
{
    tokbuf b = {0};
    int rc = 0;
    switch (t->format) {
    case KVP_CHAT_CHATML:
        if (!first)
            rc = rc ? rc : push(&b, reply_open ? t->close : -1);
        if (!first)
            rc = rc ? rc : push_text(&b, t->tok, LIT("\n"), 0);
        rc = rc ? rc : push(&b, t->open);
        rc = rc ? rc : push_text(&b, t->tok, LIT("user\n"), 0);
        rc = rc ? rc : push_text(&b, t->tok, text, len, 0);
        rc = rc ? rc : push(&b, t->close);
        rc = rc ? rc : push_text(&b, t->tok, LIT("\n"), 0);
        rc = rc ? rc : push(&b, t->open);
        rc = rc ? rc : push_text(&b, t->tok, LIT("assistant\n"), 0);
        break;
    case KVP_CHAT_LLAMA2:
        /* <s>[INST] text [/INST] reply </s><s>[INST] ... */
        if (!first && reply_open)
            rc = push(&b, t->eos);
        rc = rc ? rc : push(&b, t->bos);
        rc = rc ? rc : push_text(&b, t->tok, LIT("[INST] "), 1);
        rc = rc ? rc : push_text(&b, t->tok, text, len, 0);
        rc = rc ? rc : push_text(&b, t->tok, LIT(" [/INST]"), 0);
        break;
    case KVP_CHAT_LLAMA3:
        if (first)
            rc = push(&b, t->bos);
        else if (reply_open)
            rc = push(&b, t->eot);
        rc = rc ? rc : push(&b, t->open);
        rc = rc ? rc : push_text(&b, t->tok, LIT("user"), 0);
        rc = rc ? rc : push(&b, t->close);
        rc = rc ? rc : push_text(&b, t->tok, LIT("\n\n"), 0);
        rc = rc ? rc : push_text(&b, t->tok, text, len, 0);
        rc = rc ? rc : push(&b, t->eot);
        rc = rc ? rc : push(&b, t->open);
        rc = rc ? rc : push_text(&b, t->tok, LIT("assistant"), 0);
        rc = rc ? rc : push(&b, t->close);
        rc = rc ? rc : push_text(&b, t->tok, LIT("\n\n"), 0);
        break;
    default:
        /* Plain continuation: the user's text simply extends the document. */
        if (first)
            rc = push(&b, t->bos);
        rc = rc ? rc : push_text(&b, t->tok, text, len, 1);
        break;
    }
    if (rc < 0) {
        free(b.v);
        return rc;
    }
    *out = b.v;
    return b.n;
}

int kvp_template_reply(const kvp_template *t, const char *text, size_t len, int **out)
{
    tokbuf b = {0};
    /* Reply pieces carry their own leading spaces: no dummy prefix. */
    int rc = push_text(&b, t->tok, text, len, 0);
    if (rc < 0) {
        free(b.v);
        return rc;
    }
    *out = b.v;
    return b.n;
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
