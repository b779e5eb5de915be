/* kvp_hub_complete (sessions/hub.h): a raw text completion as a conversation of the
 * plain format. A prompt P is served as the conversation whose texts, concatenated, are
 * P: the idle resident session of the client's tenant whose messages (without a system
 * text or dropped history) concatenate to the longest prefix of P is continued with the
 * rest of P as its next message; without one, P alone is a new session's first message.
 * kvp_hub_chat then finds that session by its transcript, as for any stateless request.
 * On a model with a chat template the conversations are rendered by it, which a raw
 * prompt must not be: the prompt is then the first message of a session of its own,
 * tokenized by the plain format (BOS when the vocabulary has one, then the text), never
 * saved and dropped at its turn's end, so no chat request continues it. */
#include <stdlib.h>
#include <string.h>

#include "model/template.h"
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

void kvp_hub_complete(kvp_hub_client *c, const char *prompt, size_t len,
                      const kvp_turn_opts *o)
{
    kvp_hub *h = c->hub;
    if (h->env.tpl.format != KVP_CHAT_PLAIN || h->env.tpl.jinja) {
        /* quiet: no session event, so the answer names none (it does not last) */
        if (hub_new_session_quiet(c, NULL, 0) < 0)
            return;   /* answered (overloaded, or out of memory) */
        c->session->raw = 1;
        c->session->ephemeral = 1;
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
