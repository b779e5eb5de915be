/* A stateless request's other choices (kvp_hub_chat_choices, sessions/hub.h): the first
 * choice runs as kvp_hub_chat runs it; once its turn is done, each other choice gets a
 * new session forked from the first one's cache, cut back to the prompt by a rewind to
 * the request's history (so only the prompt's last token runs again, for the choice's
 * own logits), and its turn is queued with its own seed. Those turns start together and
 * decode in the same batched steps. The forked sessions are never saved and are dropped
 * at their turn's end (hub_events.c): the conversation a later request continues is the
 * first choice's. Loop thread. */
#include "sessions/hub.h"

#include <stdio.h>
#include <stdlib.h>

#include "sessions/hub_impl.h"
#include "turns/persist.h"
#include "turns/rewind.h"

struct kvp_hub_choices {
    kvp_hub_pending *req;            /* the request, copied */
    kvp_hub_client *more[KVP_HUB_MAX_CHOICES - 1];
    int n_more;
};

static void choices_free(struct kvp_hub_choices *ch)
{
    for (int i = 0; i < ch->n_more; i++)
        if (ch->more[i])
            ch->more[i]->waiting_in = NULL;
    hub_pending_free(ch->req);
    free(ch);
}

void hub_choices_free(kvp_hub_client *c)
{
    if (!c || !c->choices)
        return;
    choices_free(c->choices);
    c->choices = NULL;
}

void hub_choices_leave(kvp_hub_client *c)
{
    struct kvp_hub_choices *ch = c->waiting_in;
    for (int i = 0; ch && i < ch->n_more; i++)
        if (ch->more[i] == c)
            ch->more[i] = NULL;
    c->waiting_in = NULL;
}

/* Choice k (1..) of the request p on client c: a new session forked from src when src's
 * cache can be copied, else seeded with the history (prefilled whole). */
static void start_one(kvp_hub *h, kvp_session *src, kvp_hub_client *c,
                      const kvp_hub_pending *p, int k)
{
    if (hub_new_session(c, p->system, p->system_len) < 0)
        return;   /* answered (overloaded, or out of memory) */
    kvp_session *s = c->session;
    s->ephemeral = 1;
    size_t bytes = 0;
    int forked = 0;
    if (src && src->state == KVP_SESSION_IDLE && kvp_session_fork(s, src, &h->env, &bytes) == 0) {
        if (kvp_session_rewind(s, p->msgs, p->n - 1) == 0)
            forked = 1;
        else   /* no room for the history: the copy goes, the history is prefilled */
            kvp_session_forget(s);
    }
    if (forked) {
        s->rq.reuse_from = KVP_REUSE_OTHER;
        /* its own rows count against the memory cap, and src's, which may have become
         * a block both read (charged to src) */
        kvp_session_count_bytes(s);
        kvp_session_count_bytes(src);
    } else if (p->n > 1 && kvp_session_seed(s, p->msgs, p->n - 1) < 0) {
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    kvp_turn_opts o = p->o;
    o.role = p->msgs[p->n - 1].user;
    if (o.has_seed)
        o.seed += (uint64_t)k;
    hub_start_turn(c, p->msgs[p->n - 1].text, p->msgs[p->n - 1].len, &o);
    /* the state first: a queued turn's rewind_set is its worker's (the start clears it) */
    if (s->state != KVP_SESSION_TURN && s->rq.rewind_set)
        kvp_session_rewind_clear(s);   /* refused: answered */
}

void hub_choices_run(kvp_hub *h, kvp_session *src, struct kvp_hub_choices *ch, int go)
{
    for (int i = 0; i < ch->n_more; i++) {
        kvp_hub_client *c = ch->more[i];
        if (!c)   /* closed meanwhile */
            continue;
        c->waiting_in = NULL;
        ch->more[i] = NULL;
        if (go)
            start_one(h, src, c, ch->req, i + 1);
    }
    choices_free(ch);
}

void kvp_hub_chat_choices(kvp_hub_client *c, kvp_hub_client *const *more, int n_more,
                          const char *id, const char *system, size_t system_len,
                          const kvp_message *msgs, int n, const kvp_turn_opts *o)
{
    hub_choices_free(c);
    if (n_more < 0 || n_more >= KVP_HUB_MAX_CHOICES) {
        hub_emit_error(c, KVPD_E_BAD_REQUEST, "n is out of range: 1 to 8 choices");
        return;
    }
    /* more sessions at once than the server ever holds: refused before any prefill */
    kvp_hub *h = c->hub;
    int need = n_more + 1, cap = h->cfg->max_sessions;
    if (h->cfg->max_sessions_per_tenant > 0 && h->cfg->max_sessions_per_tenant < cap)
        cap = h->cfg->max_sessions_per_tenant;
    if (n_more > 0 && need > cap) {
        char err[160];
        snprintf(err, sizeof err, "%d choices need %d sessions at once; at most %d are held "
                 "(max_sessions, max_sessions_per_tenant)", need, need, cap);
        hub_emit_error(c, KVPD_E_OVERLOADED, err);
        return;
    }
    if (n_more > 0 && n >= 1) {
        struct kvp_hub_choices *ch = calloc(1, sizeof *ch);
        if (!ch || !(ch->req = hub_pending_new(0, system, system_len, msgs, n, o))) {
            free(ch);
            hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
            return;
        }
        for (int i = 0; i < n_more; i++) {
            hub_choices_leave(more[i]);
            ch->more[i] = more[i];
            more[i]->waiting_in = ch;
        }
        ch->n_more = n_more;
        c->choices = ch;
    }
    kvp_hub_chat(c, id, system, system_len, msgs, n, o);
}
