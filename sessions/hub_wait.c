/* New conversations that share a long prefix with one whose first turn is prefilling it
 * wait for that turn to end, then fork it (hub_match.c) and prefill only their own rest,
 * instead of prefilling the same prefix side by side.
 *
 * A new session's first turn puts its rendered prompt into the prefix index marked in
 * flight (s->prefix_inflight) while the turn runs. A new request that finds there a
 * prefix at least KVP_HUB_WAIT_GAIN tokens longer than any idle source gives it is copied
 * (kvp_hub_pending) and parked on that session; the session made to render it goes (it
 * holds no slot while it waits). When the source's job ends (done, cancelled, failed),
 * its waiters are matched again on the loop without waiting: the source is idle then and
 * a fork source like any other, or, when its cache does not hold the prefix (cancelled
 * early, failed), they find another or prefill themselves. A waiter holds no session, so
 * no session ever waits on a waiting one; admission applies when it goes on, and its
 * turn's queue time and time to first token count from its arrival. Loop thread. */
#include "sessions/hub.h"

#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "sessions/hub_impl.h"
#include "store/prefix.h"

struct hub_wait {
    struct hub_wait *next, **pprev;  /* h->waits */
    kvp_hub_client *c;
    const kvp_session *src;          /* NULL once its job ended (released) */
    kvp_hub_pending *req;
    double since;                    /* when the request arrived (kvp_now) */
};

void hub_wait_mark(kvp_hub *h, kvp_session *s)
{
    /* an ephemeral turn is no source: a request waiting on it would fork nothing */
    if (h->prefix && !s->ephemeral && kvp_prefix_put(h->prefix, s, s->tenant, s->tokens, s->n_tokens) == 0)
        s->prefix_inflight = 1;
}

void hub_wait_unmark(kvp_hub *h, kvp_session *s)
{
    if (s->prefix_inflight)
        kvp_prefix_remove(h->prefix, s);
    s->prefix_inflight = 0;
}

/* Only what the loop owns while a turn runs is read: the state, the mark, the tenant and
 * the policy conf (the turn's tokens and cache are its worker's). */
static int inflight_ok(void *ctx, const void *owner)
{
    const hub_source_filter *f = ctx;
    const kvp_session *t = owner;
    return t->state == KVP_SESSION_TURN && t->prefix_inflight &&
           !strcmp(t->tenant, f->c->tenant) && t->pconf == f->h->pconf;
}

const kvp_session *hub_wait_source(kvp_hub *h, const kvp_hub_client *c, const int *tokens,
                                   int n, int have)
{
    if (!h->prefix)
        return NULL;
    hub_source_filter f = {h, c};
    int len;
    const kvp_session *t = kvp_prefix_lookup(h->prefix, c->tenant, tokens, n, inflight_ok, &f,
                                             &len);
    return t && len >= have + KVP_HUB_WAIT_GAIN ? t : NULL;
}

int hub_wait_park(kvp_hub_client *c, const kvp_session *src, const char *system,
                  size_t system_len, const kvp_message *msgs, int n, const kvp_turn_opts *o)
{
    kvp_hub *h = c->hub;
    if (c->wait || h->n_waits >= KVP_HUB_MAX_WAITS)
        return -1;
    int mine = 0;
    for (const struct hub_wait *w = h->waits; w; w = w->next)
        mine += !strcmp(w->c->tenant, c->tenant);
    if (mine >= KVP_HUB_MAX_WAITS_PER_TENANT)
        return -1;
    struct hub_wait *w = calloc(1, sizeof *w);
    if (!w || !(w->req = hub_pending_new(0, system, system_len, msgs, n, o))) {
        free(w);
        return -1;
    }
    w->c = c;
    w->src = src;
    w->since = kvp_now();
    w->next = h->waits;
    w->pprev = &h->waits;
    if (h->waits)
        h->waits->pprev = &w->next;
    h->waits = w;
    h->n_waits++;
    c->wait = w;
    h->m->prefix_waits++;
    return 0;
}

/* w leaves the list and its client; its request is freed unless taken (w->req NULL). */
static void wait_free(kvp_hub *h, struct hub_wait *w)
{
    *w->pprev = w->next;
    if (w->next)
        w->next->pprev = w->pprev;
    h->n_waits--;
    w->c->wait = NULL;
    hub_pending_free(w->req);
    free(w);
}

void hub_wait_leave(kvp_hub_client *c)
{
    if (c->wait)
        wait_free(c->hub, c->wait);
}

int hub_wait_take(kvp_hub *h, const kvp_session *src)
{
    int n = 0;
    for (struct hub_wait *w = h->waits; w; w = w->next)
        if (w->src == src) {
            w->src = NULL;
            n++;
        }
    return n;
}

/* The first waiter whose source's job ended, or NULL. */
static struct hub_wait *released(const kvp_hub *h)
{
    struct hub_wait *w = h->waits;
    while (w && w->src)
        w = w->next;
    return w;
}

void hub_wait_resume(kvp_hub *h)
{
    struct hub_wait *w;
    /* one at a time from the list: a waiter going on may answer (and a front end then
     * close) only its own client */
    while ((w = released(h))) {
        kvp_hub_client *c = w->c;
        kvp_hub_pending *p = w->req;
        double w_since = w->since;
        w->req = NULL;
        wait_free(h, w);
        if (h->draining)
            hub_emit_error(c, KVPD_E_OVERLOADED, "the daemon is shutting down");
        else
            hub_chat_new(c, p->system, p->system_len, p->msgs, p->n, &p->o, w_since, 0);
        hub_pending_free(p);
    }
}

void hub_wait_drain(kvp_hub *h)
{
    while (h->waits) {
        kvp_hub_client *c = h->waits->c;
        wait_free(h, h->waits);
        hub_emit_error(c, KVPD_E_OVERLOADED, "the daemon is shutting down");
    }
}

void hub_wait_free(kvp_hub *h)
{
    while (h->waits)
        wait_free(h, h->waits);
}
