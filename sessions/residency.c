/* Residency: the memory cap, max_sessions, LRU parking. */
#include "sessions/residency.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "store/prefix.h"
#include "store/store.h"

size_t kvp_turn_bytes(const kvp_model_config *m, size_t row_bytes, int budget, int chunk,
                      const char *policy, int budget_mode)
{
    int evicts = budget > 0 && strcmp(policy, "none");
    long rows = evicts ? (long)budget + chunk : m->seq_len;
    /* the context shift keeps a head within the context; global budgets bound the
     * session's total, (budget + chunk) x heads rows, not each head */
    if (rows > m->seq_len && !(evicts && budget_mode == KVP_BUDGET_GLOBAL))
        rows = m->seq_len;
    /* A head's allocation doubles from 16 rows, so it stays under twice what it holds
     * (kvp_head_reserve); a cache restored from a snapshot is allocated the same way. */
    long cap = rows * 2 < 16 ? 16 : rows * 2;
    return (size_t)cap * row_bytes * (size_t)m->n_layers * (size_t)m->n_kv_heads;
}

size_t kvp_hub_turn_bytes(const kvp_hub *h)
{
    return kvp_turn_bytes(&h->env.model->cfg, h->row_bytes, h->cfg->budget, h->env.chunk,
                          h->pconf->name, h->env.budget_mode);
}

static size_t counted(const kvp_session *s)
{
    if (s->state == KVP_SESSION_PARKED)
        return 0;
    return kvp_session_busy(s) ? s->reserve + s->reserve_lp : s->bytes;
}

size_t kvp_hub_accounted_bytes(kvp_hub *h, size_t *actual, size_t *shared)
{
    size_t sum = 0, act = 0, sh = 0;
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext) {
        /* an idle session reading shared blocks is counted again: a block whose payer
         * let it go (parked, dropped, copied its rows) is charged to the next holder, so
         * every block counts once however its holders come and go */
        if (s->shares && !kvp_session_busy(s))
            kvp_session_count_bytes(s);
        sum += counted(s);
        act += s->bytes;
        sh += s->shared_bytes;
    }
    if (actual)
        *actual = act;
    if (shared)
        *shared = sh;
    return sum;
}

void kvp_hub_park(kvp_hub *h, kvp_session *s)
{
    kvp_store_lease_drop(h->env.store, s->id);
    kvp_session_park(&h->sessions, s);
    h->m->parks++;
}

/* victim leaves memory to make room: parked with a store, dropped without one. */
static void make_room(kvp_hub *h, kvp_session *victim)
{
    if (h->env.store) {
        kvp_hub_park(h, victim);
    } else {
        h->m->sessions_dropped++;
        kvp_hub_drop(h, victim);
    }
}

/* The least recently used idle session that can make room, other than keep: with a
 * store one that can be parked; without one, one no client is attached to (a finished
 * API request's, a left websocket's), which is dropped: finished one-shot sessions must
 * not lock new conversations out until their idle timeout. */
static kvp_session *lru_victim(kvp_hub *h, const kvp_session *keep)
{
    kvp_session *best = NULL;
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext)
        if (s != keep && (h->env.store ? kvp_session_parkable(s)
                                       : !kvp_session_busy(s) && !s->client) &&
            (!best || s->last_active < best->last_active))
            best = s;
    return best;
}

/* The milliseconds until the least recently used idle session reaches its idle timeout
 * (and leaves memory or is parked), for a refusal while no job runs; 0 when one does
 * (it ends about a turn from now). */
static int idle_retry_ms(const kvp_hub *h)
{
    double oldest = 0;
    int any = 0;
    for (const kvp_session *s = h->sessions.resident_head; s; s = s->rnext) {
        if (kvp_session_busy(s))
            return 0;
        if (!any || s->last_active < oldest)
            oldest = s->last_active;
        any = 1;
    }
    double left = any ? oldest + h->cfg->idle_timeout_s - kvp_now() : 1;
    return left < 1 ? 1000 : left > 86400 ? 86400000 : (int)(left * 1e3);
}

/* Makes room among the tenant's own sessions: its least recently used one that can go
 * (other than keep) is parked, or dropped without a store. 0, or -1 when none can. */
static int tenant_make_room(kvp_hub *h, const kvp_session *keep, const char *tenant,
                            int *busy)
{
    kvp_session *victim = NULL;
    *busy = 0;
    for (kvp_session *r = h->sessions.resident_head; r; r = r->rnext) {
        if (r == keep || strcmp(r->tenant, tenant))
            continue;
        *busy |= kvp_session_busy(r);
        if ((h->env.store ? kvp_session_parkable(r) : !kvp_session_busy(r) && !r->client) &&
            (!victim || r->last_active < victim->last_active))
            victim = r;
    }
    if (!victim)
        return -1;
    make_room(h, victim);
    return 0;
}

/* At max_sessions_per_tenant resident sessions, a new or parked one of the tenant makes
 * room among the tenant's own. */
static int tenant_sessions(kvp_hub *h, const kvp_session *s, const char *tenant, char *why,
                           size_t whylen)
{
    int cap = h->cfg->max_sessions_per_tenant;
    if (cap <= 0 || (s && s->state != KVP_SESSION_PARKED))
        return 0;
    for (;;) {
        int n = 0, busy;
        for (const kvp_session *r = h->sessions.resident_head; r; r = r->rnext)
            n += !strcmp(r->tenant, tenant);
        if (n < cap)
            return 0;
        if (tenant_make_room(h, s, tenant, &busy) < 0) {
            /* a turn of its own ends in about a turn's time; else its oldest idle one
             * is let go at its idle timeout */
            h->refused_retry_ms = busy ? 0 : idle_retry_ms(h);
            snprintf(why, whylen, "this API key has %d sessions in memory "
                     "(max_sessions_per_tenant), none of them idle and free to park", n);
            return -EBUSY;
        }
    }
}

/* A job on s (NULL: a new session, which holds nothing until its first job) within
 * max_cache_bytes_per_tenant: the tenant's other sessions, counted as the global cap
 * counts them, plus the job's reservation. A tenant's only session is never refused by
 * it: the bound shares the cache between tenants, it does not shrink a turn. */
static int tenant_bytes(kvp_hub *h, const kvp_session *s, const char *tenant, int job,
                        size_t extra, char *why, size_t whylen)
{
    uint64_t cap = h->cfg->max_cache_bytes_per_tenant;
    if (!cap || !job)
        return 0;
    size_t need = kvp_hub_turn_bytes(h);
    if (s && s->state != KVP_SESSION_PARKED && s->bytes > need)
        need = s->bytes;
    need += extra;
    for (;;) {
        size_t mine = 0;
        int others = 0, busy;
        (void)kvp_hub_accounted_bytes(h, NULL, NULL);   /* blocks a victim let go, recharged */
        for (const kvp_session *r = h->sessions.resident_head; r; r = r->rnext)
            if (r != s && !strcmp(r->tenant, tenant)) {
                mine += counted(r);
                others++;
            }
        if (!others || mine + need <= cap)
            return 0;
        if (tenant_make_room(h, s, tenant, &busy) < 0) {
            h->refused_retry_ms = busy ? 0 : idle_retry_ms(h);
            snprintf(why, whylen, "this API key's sessions hold %zu bytes of KV cache "
                     "(max_cache_bytes_per_tenant %llu), none of them idle and free to park",
                     mine, (unsigned long long)cap);
            return -EBUSY;
        }
    }
}

int kvp_hub_admit_tenant(kvp_hub *h, const kvp_session *s, const char *tenant, int job,
                         size_t extra, char *why, size_t whylen)
{
    int rc = tenant_sessions(h, s, tenant, why, whylen);
    return rc < 0 ? rc : tenant_bytes(h, s, tenant, job, extra, why, whylen);
}

int kvp_hub_admit(kvp_hub *h, kvp_session *s, int job, size_t extra, size_t *reserve,
                  char *why, size_t whylen)
{
    size_t need = 0;
    int parked = s && s->state == KVP_SESSION_PARKED;
    if (job) {
        need = kvp_hub_turn_bytes(h);
        if (s && !parked && s->bytes > need)   /* kept from a larger budget: it only shrinks */
            need = s->bytes;
    }
    int slots = h->sessions.resident + (!s || parked);
    size_t others = kvp_hub_accounted_bytes(h, NULL, NULL) - (s ? counted(s) : 0);
    uint64_t cap = h->cfg->max_cache_bytes;
    while (slots > h->cfg->max_sessions || (cap && others + need + extra > cap)) {
        kvp_session *victim = lru_victim(h, s);
        if (!victim) {
            h->refused_retry_ms = idle_retry_ms(h);
            if (slots > h->cfg->max_sessions)
                snprintf(why, whylen, "too many sessions (%d)", h->cfg->max_sessions);
            else
                snprintf(why, whylen, "the KV cache memory cap (%llu bytes) is taken by "
                         "running turns%s", (unsigned long long)cap,
                         extra ? " (this turn's logprobs buffers count in it)" : "");
            return -EBUSY;
        }
        slots--;
        make_room(h, victim);
        /* what the victim frees: its own rows, and the shared blocks no one else reads
         * (the others' are charged to a holder that stays) */
        others = kvp_hub_accounted_bytes(h, NULL, NULL) - (s ? counted(s) : 0);
    }
    *reserve = need;
    return 0;
}

/* ---- leaving memory ---- */

/* A session leaves memory; it stays in the transcript index while it is on disk. */
void kvp_hub_remove(kvp_hub *h, kvp_session *s)
{
    if (!h->env.store || !s->has_snapshot || s->res.lost)
        kvp_transcripts_remove(&h->transcripts, s->id);
    kvp_store_lease_drop(h->env.store, s->id);
    kvp_prefix_remove(h->prefix, s);
    kvp_session_remove(&h->sessions, s);
}

void kvp_hub_drop(kvp_hub *h, kvp_session *s)
{
    if (s->client)
        s->client->session = NULL;
    kvp_hub_remove(h, s);
}
