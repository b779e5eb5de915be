/* Residency: the memory cap, max_sessions, LRU parking. */
#include "daemon/residency.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>


size_t kvpd_turn_bytes(const kvpd *d)
{
    return kvpd_turn_bytes_at(d, d->cfg.budget, d->pconf);
}

size_t kvpd_turn_bytes_at(const kvpd *d, int budget, const kvp_policy_conf *pc)
{
    const kvp_model_config *m = &d->model.cfg;
    int evicts = budget > 0 && strcmp(pc->name, "none");
    long rows = evicts ? (long)budget + d->cfg.chunk : m->seq_len;
    if (rows > m->seq_len)
        rows = m->seq_len;   /* the context shift keeps a head within the context */
    /* A head's allocation doubles from 16 rows, so it stays under twice what it holds
     * (kvp_head_reserve); a cache restored from a snapshot is allocated the same way. */
    long cap = rows * 2 < 16 ? 16 : rows * 2;
    return (size_t)cap * d->row_bytes * (size_t)m->n_layers * (size_t)m->n_kv_heads;
}

static size_t counted(const kvp_session *s)
{
    if (s->parked)
        return 0;
    return s->busy ? s->reserve : s->bytes;
}

size_t kvpd_accounted_bytes(const kvpd *d, size_t *actual)
{
    size_t sum = 0, act = 0;
    for (const kvp_session *s = d->sessions.head; s; s = s->next) {
        sum += counted(s);
        act += s->parked ? 0 : s->bytes;
    }
    if (actual)
        *actual = act;
    return sum;
}

void kvpd_park(kvpd *d, kvp_session *s)
{
    kvp_session_park(&d->sessions, s);
    d->metrics.parks++;
}

/* The least recently used idle session that can be parked, other than keep. */
static kvp_session *lru_parkable(kvpd *d, const kvp_session *keep)
{
    if (!d->env.state_dir[0])
        return NULL;
    kvp_session *best = NULL;
    for (kvp_session *s = d->sessions.head; s; s = s->next)
        if (s != keep && kvp_session_parkable(s) && (!best || s->last_active < best->last_active))
            best = s;
    return best;
}

int kvpd_admit(kvpd *d, kvp_session *s, int job, size_t *reserve, char *why, size_t whylen)
{
    size_t need = 0;
    if (job) {
        need = kvpd_turn_bytes(d);
        if (s && !s->parked && s->bytes > need)   /* kept from a larger budget: it only shrinks */
            need = s->bytes;
    }
    int slots = d->sessions.resident + (!s || s->parked);
    size_t others = kvpd_accounted_bytes(d, NULL) - (s ? counted(s) : 0);
    uint64_t cap = d->cfg.max_cache_bytes;
    while (slots > d->sessions.max || (cap && others + need > cap)) {
        kvp_session *victim = lru_parkable(d, s);
        if (!victim) {
            if (slots > d->sessions.max)
                snprintf(why, whylen, "too many sessions (%d)", d->sessions.max);
            else
                snprintf(why, whylen, "the KV cache memory cap (%llu bytes) is taken by "
                         "running turns", (unsigned long long)cap);
            return -EBUSY;
        }
        others -= victim->bytes;
        slots--;
        kvpd_park(d, victim);
    }
    *reserve = need;
    return 0;
}

int kvpd_retry_hint_ms(const kvpd *d)
{
    /* About one turn's time: a running turn should have ended by then. */
    const kvpd_hist *h = &d->metrics.turn_duration;
    double ms = h->count ? h->sum / (double)h->count * 1e3 : 100;
    return ms < 50 ? 50 : ms > 5000 ? 5000 : (int)ms;
}
