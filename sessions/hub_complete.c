/* kvp_hub_complete (sessions/hub.h): a raw text completion as a conversation of the
 * plain format. A prompt P is served as the conversation whose texts, concatenated, are
 * P: the idle resident session of the client's tenant whose messages (without a system
 * text or dropped history) concatenate to the longest prefix of P is continued with the
 * rest of P as its next message; without one, P alone is a new session's first message.
 * kvp_hub_chat then finds that session by its transcript, as for any stateless request.
 * On a model with a chat template the conversations are rendered by it, which a raw
 * prompt must not be: the prompt is then the first message of a session of its own,
 * tokenized by the plain format (BOS when the vocabulary has one, then the text), never
 * saved and dropped at its turn's end, so no chat request continues it (and so is a
 * prompt asked to be prefilled fresh, and one given as token ids). The tokenizer of raw
 * prompts is offered too (kvp_hub_tokenize, kvp_hub_token_piece). */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "model/template.h"
#include "model/tokenizer.h"
#include "sessions/hub_impl.h"

/* The bytes of s's messages when they concatenate to a proper prefix of prompt (some of
 * the prompt is left for the next message), else -1. */
static long prefix_of(const kvp_hub_client *c, const kvp_session *s, const char *prompt,
                      size_t len)
{
    if (kvp_session_busy(s) || s->state == KVP_SESSION_PARKED || s->n_msgs == 0 ||
        s->hist_msgs > 0 || s->transcript_dropped || s->system_len > 0 ||
        strcmp(s->tenant, c->tenant) || s->msgs[s->n_msgs - 1].user)
        return -1;
    size_t at = 0;
    for (int i = 0; i < s->n_msgs; i++) {
        const kvp_message *m = &s->msgs[i];
        if (m->user != !(i & 1) || m->len > len - at || memcmp(prompt + at, m->text, m->len))
            return -1;
        at += m->len;
    }
    return at < len ? (long)at : -1;
}

static void refuse(kvp_hub_client *c, const char *code, const char *msg)
{
    kvp_hub_event ev = {.type = KVP_HUB_ERROR, .code = code, .text = msg, .len = strlen(msg)};
    c->sink(c->ctx, &ev);
}

static void oom(kvp_hub_client *c)
{
    refuse(c, KVPD_E_INTERNAL, "out of memory");
}

/* A session of the client's own for one raw prompt: tokenized by the plain format,
 * never saved or continued. Quiet: no session event, so the answer names none (it does
 * not last). NULL when answered (overloaded, or out of memory). */
static kvp_session *own_session(kvp_hub_client *c)
{
    if (hub_new_session_quiet(c, NULL, 0) < 0)
        return NULL;
    c->session->raw = 1;
    c->session->ephemeral = 1;
    return c->session;
}

void kvp_hub_complete(kvp_hub_client *c, const char *prompt, size_t len,
                      const kvp_turn_opts *o)
{
    kvp_hub *h = c->hub;
    if (h->env.tpl.format != KVP_CHAT_PLAIN || h->env.tpl.jinja || o->fresh) {
        if (own_session(c))
            hub_start_turn(c, prompt, len, o);
        return;
    }
    const kvp_session *best = NULL;
    long best_len = 0;
    for (const kvp_session *s = h->sessions.resident_head; s; s = s->rnext) {
        long n = prefix_of(c, s, prompt, len);
        if (n > best_len) {
            best = s;
            best_len = n;
        }
    }
    int n = best ? best->n_msgs + 1 : 1;
    kvp_message *msgs = calloc((size_t)n, sizeof *msgs);
    if (!msgs) {
        oom(c);
        return;
    }
    for (int i = 0; i + 1 < n; i++)
        msgs[i] = best->msgs[i];   /* borrowed: kvp_hub_chat copies what it keeps */
    /* The rest of the prompt, NUL-terminated as a message's text is. */
    size_t rest = len - (size_t)best_len;
    char *text = malloc(rest + 1);
    if (!text) {
        free(msgs);
        oom(c);
        return;
    }
    memcpy(text, prompt + best_len, rest);
    text[rest] = '\0';
    msgs[n - 1] = (kvp_message){1, text, rest};
    char id[KVP_SESSION_ID_LEN + 1];
    snprintf(id, sizeof id, "%s", best ? best->id : "");
    kvp_hub_chat(c, id, NULL, 0, msgs, n, o);
    free(text);
    free(msgs);
}

const char *kvp_hub_token_piece(const kvp_hub *h, int prev, int id, size_t *len)
{
    *len = 0;
    if (id < 0 || id >= h->env.tpl_raw.tok->vocab_size)
        return NULL;
    return kvp_tokenizer_piece(h->env.tpl_raw.tok, prev, id, len);
}

int kvp_hub_tokenize(const kvp_hub *h, const char *text, size_t len, int add_special, int **ids)
{
    const kvp_template *t = &h->env.tpl_raw;
    *ids = NULL;
    if (len > (size_t)1 << 28)
        return -E2BIG;
    /* at most a token a byte, the dummy prefix's and BOS */
    int max = (int)len + 2;
    int *out = malloc((size_t)max * sizeof *out);
    if (!out)
        return -ENOMEM;
    int n = 0;
    if (add_special && t->bos >= 0)
        out[n++] = t->bos;
    int k = len ? kvp_tokenizer_encode(t->tok, text, len, 0, out + n, max - n) : 0;
    if (k < 0) {
        free(out);
        return k;
    }
    n += k;
    if (!n) {
        free(out);
        return 0;
    }
    *ids = out;
    return n;
}

void kvp_hub_complete_tokens(kvp_hub_client *c, const int *ids, int n, const kvp_turn_opts *o)
{
    kvp_hub *h = c->hub;
    int vocab = h->env.tpl_raw.tok->vocab_size;
    if (n < 1) {
        refuse(c, KVPD_E_BAD_REQUEST, "the prompt has no tokens");
        return;
    }
    size_t len = 0, piece;
    for (int i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= vocab) {
            char msg[96];
            snprintf(msg, sizeof msg, "prompt token %d (%d) is not below the vocabulary size %d",
                     i, ids[i], vocab);
            refuse(c, KVPD_E_BAD_REQUEST, msg);
            return;
        }
        kvp_tokenizer_piece(h->env.tpl_raw.tok, i ? ids[i - 1] : -1, ids[i], &piece);
        len += piece;
    }
    /* the message's text: the tokens' pieces end to end, as valid UTF-8 (a byte that
     * forms no character as U+FFFD), as every message's text is */
    char *text = malloc(3 * len + 8);
    int *copy = malloc((size_t)n * sizeof *copy);
    if (!text || !copy) {
        free(text);
        free(copy);
        oom(c);
        return;
    }
    kvp_utf8 u = {0};
    len = 0;
    for (int i = 0; i < n; i++) {
        const char *p = kvp_tokenizer_piece(h->env.tpl_raw.tok, i ? ids[i - 1] : -1, ids[i], &piece);
        len += kvp_utf8_feed(&u, p, piece, text + len);
    }
    len += kvp_utf8_flush(&u, text + len);
    text[len] = '\0';
    memcpy(copy, ids, (size_t)n * sizeof *copy);
    kvp_session *s = own_session(c);
    if (s) {
        s->raw_ids = copy;
        s->n_raw_ids = n;
        copy = NULL;
        hub_start_turn(c, text, len, o);
    }
    free(copy);
    free(text);
}
