/* The sessions this node holds live (store/store.h, kvp_store_set_live): a sorted
 * array of ids under its own mutex, so the time to live never deletes the snapshot of a
 * session in memory or attached. The hub replaces the whole set once a second (from the
 * loop: a copy and a sort, no I/O); a read or a write of a snapshot adds its id at once
 * (a worker), which covers a session loaded between two replacements. The directory's
 * sweep checks and deletes one id under the mutex, so a read that begins meanwhile finds
 * either the snapshot or nothing, never a snapshot deleted under a session in memory. */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/store_impl.h"

static int cmp_id(const void *a, const void *b)
{
    return strcmp((const char *)a, (const char *)b);
}

static int find(const kvp_store *st, const char *id, int *at)
{
    return kvp_store_id_search(st->live, st->n_live, sizeof *st->live, 0, id, at);
}

int kvp_store_set_live(kvp_store *st, const char *const *ids, int n)
{
    if (!st)
        return 0;
    kvp_store_id *v = n > 0 ? malloc((size_t)n * sizeof *v) : NULL;
    if (n > 0 && !v)
        return -ENOMEM;   /* the previous set stays */
    int m = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] && strlen(ids[i]) <= KVP_SNAPSHOT_ID_MAX)
            memcpy(v[m++], ids[i], strlen(ids[i]) + 1);
    if (m > 1)
        qsort(v, (size_t)m, sizeof *v, cmp_id);
    pthread_mutex_lock(&st->live_mu);
    free(st->live);
    st->live = v;
    st->n_live = st->cap_live = m;
    pthread_mutex_unlock(&st->live_mu);
    return 0;
}

void kvp_store_live_add(kvp_store *st, const char *id)
{
    if (strlen(id) > KVP_SNAPSHOT_ID_MAX)
        return;
    pthread_mutex_lock(&st->live_mu);
    int at;
    if (!find(st, id, &at)) {
        if (st->n_live == st->cap_live) {
            int cap = st->cap_live ? 2 * st->cap_live : 16;
            kvp_store_id *v = realloc(st->live, (size_t)cap * sizeof *v);
            if (!v) {   /* not kept live until the hub's next replacement */
                pthread_mutex_unlock(&st->live_mu);
                return;
            }
            st->live = v;
            st->cap_live = cap;
        }
        memmove(st->live + at + 1, st->live + at, (size_t)(st->n_live - at) * sizeof *st->live);
        memcpy(st->live[at], id, strlen(id) + 1);
        st->n_live++;
    }
    pthread_mutex_unlock(&st->live_mu);
}

int kvp_store_live_has_locked(const kvp_store *st, const char *id)
{
    int at;
    return find(st, id, &at);
}

int kvp_store_live_copy(kvp_store *st, kvp_store_id **out)
{
    pthread_mutex_lock(&st->live_mu);
    int n = st->n_live;
    *out = n ? malloc((size_t)n * sizeof **out) : NULL;
    if (n && !*out)
        n = 0;
    else if (n)
        memcpy(*out, st->live, (size_t)n * sizeof **out);
    pthread_mutex_unlock(&st->live_mu);
    return n;
}
