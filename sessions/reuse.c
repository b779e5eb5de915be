/* Choosing the session a request continues from an earlier point (sessions/reuse.h). */
#include "sessions/reuse.h"

#include <string.h>

#include "observe/metrics.h"

static int same_message(const kvp_message *a, const kvp_message *b)
{
    return a->user == b->user && a->len == b->len && !memcmp(a->text, b->text, a->len);
}

kvp_session *kvp_reuse_rewind_find(kvp_hub *h, const kvp_hub_client *c, const char *id,
                                   const char *system, size_t system_len,
                                   const kvp_message *msgs, int n)
{
    kvp_session *best = NULL;
    int best_k = -1;
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext) {
        if (s->state != KVP_SESSION_IDLE || s->ephemeral || strcmp(s->tenant, c->tenant) ||
            (s->client && s->client != c) || s->hist_msgs || s->transcript_dropped ||
            s->n_msgs == 0 || s->system_len != system_len ||
            (system_len && memcmp(s->system, system, system_len)))
            continue;
        int k = 0;
        while (k < s->n_msgs && k < n && same_message(&s->msgs[k], &msgs[k]))
            k++;
        int named = id && id[0] && !strcmp(s->id, id);
        if (k < 1 || k < s->n_msgs - 2)
            continue;
        /* the named one wins; then the most messages shared, then the newest */
        if (named) {
            best = s;
            break;
        }
        if (k > best_k || (k == best_k && s->last_active > best->last_active)) {
            best = s;
            best_k = k;
        }
    }
    return best;
}

int kvp_reuse_shared_msgs(const kvp_session *s, const char *system, size_t system_len,
                          const kvp_message *msgs, int n)
{
    if (s->system_len != system_len || (system_len && memcmp(s->system, system, system_len)))
        return 0;
    int k = 0;
    while (k < s->n_msgs && k < n && same_message(&s->msgs[k], &msgs[k]))
        k++;
    return k;
}

int kvp_reuse_fork_source_ok(const kvp_hub *h, const kvp_hub_client *c, const kvp_session *s)
{
    return s->state == KVP_SESSION_IDLE && !s->ephemeral && !strcmp(s->tenant, c->tenant) &&
           s->pconf == h->pconf && s->policy && !s->hist_msgs && !s->hist_tokens &&
           !s->transcript_dropped && s->n_cached > 0 && s->cache.n_seen == s->n_cached &&
           s->n_cached <= s->n_tokens;
}

kvp_session *kvp_reuse_fork_find(kvp_hub *h, const kvp_hub_client *c, const char *system,
                                 size_t system_len, const kvp_message *msgs, int n,
                                 int *shared)
{
    kvp_session *best = NULL;
    int best_k = -1;
    *shared = 0;
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext) {
        if (!kvp_reuse_fork_source_ok(h, c, s) || s->system_len != system_len ||
            (system_len && memcmp(s->system, system, system_len)))
            continue;
        int k = 0;
        while (k < s->n_msgs && k < n && same_message(&s->msgs[k], &msgs[k]))
            k++;
        if (k < 1 && !system_len)
            continue;
        if (!best || k > best_k || (k == best_k && s->n_cached > best->n_cached) ||
            (k == best_k && s->n_cached == best->n_cached && s->last_active > best->last_active)) {
            best = s;
            best_k = k;
        }
    }
    if (best)
        *shared = best_k;
    return best;
}

void kvp_reuse_count(kvpd_metrics *m, const kvp_turn_stats *st)
{
    uint64_t n = st->cached_tokens > 0 ? (uint64_t)st->cached_tokens : 0;
    if (st->cached_from == KVP_REUSE_OTHER)
        m->reused_other += n;
    else if (st->cached_from == KVP_REUSE_SHARED)
        m->reused_shared += n;
    else
        m->reused_own += n;
}
