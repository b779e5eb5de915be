/* Loading a fork source that is not resident (sessions/prefix_load.h). */
#include "sessions/prefix_load.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "turns/persist.h"
#include "store/prefix.h"
#include "sessions/reuse.h"

_Static_assert(KVP_PREFIX_FILE_TENANT_MAX >= KVP_TENANT_LEN, "a record holds a whole tenant");

/* A conversation known only on disk: the index's owner. id "" once read. */
typedef struct disk_source {
    char id[KVP_SNAPSHOT_ID_MAX + 1];
    char tenant[KVP_PREFIX_FILE_TENANT_MAX + 1];
    struct disk_source *next;   /* the list of those added since the start */
} disk_source;

struct kvp_prefix_disk {
    kvp_prefix_index *ix;
    disk_source *v;       /* [n] read at start, never moved: the index points into it */
    disk_source *added;   /* let go from memory since the start (hub_prefix_disk_keep) */
    int n, n_added, live;
};

static struct kvp_prefix_disk *disk_new(int n)
{
    struct kvp_prefix_disk *d = calloc(1, sizeof *d);
    if (d && (!(d->ix = kvp_prefix_create(0, 0)) ||
              (n > 0 && !(d->v = calloc((size_t)n, sizeof *d->v))))) {
        kvp_prefix_free(d->ix);
        free(d);
        d = NULL;
    }
    return d;
}

int hub_prefix_adopt(kvp_hub *h, kvp_prefix_recs *x)
{
    int rc = 0;
    if (x->n > 0) {
        struct kvp_prefix_disk *d = disk_new(x->n);
        if (!d) {
            rc = -ENOMEM;
        } else {
            for (int i = 0; i < x->n; i++) {
                disk_source *s = &d->v[d->n];
                snprintf(s->id, sizeof s->id, "%s", x->v[i].id);
                snprintf(s->tenant, sizeof s->tenant, "%s", x->v[i].tenant);
                if (kvp_prefix_put_chain(d->ix, s, s->tenant, x->v[i].chain, x->v[i].n) == 0)
                    d->n++;
            }
            d->live = d->n;
            h->prefix_disk = d;
        }
    }
    kvp_prefix_recs_free(x);
    return rc;
}

void hub_prefix_disk_free(kvp_hub *h)
{
    if (!h->prefix_disk)
        return;
    struct kvp_prefix_disk *d = h->prefix_disk;
    while (d->added) {
        disk_source *next = d->added->next;
        free(d->added);
        d->added = next;
    }
    kvp_prefix_free(d->ix);
    free(d->v);
    free(d);
    h->prefix_disk = NULL;
}

size_t hub_prefix_disk_bytes(const kvp_hub *h)
{
    const struct kvp_prefix_disk *d = h->prefix_disk;
    return d ? sizeof *d + (size_t)(d->n + d->n_added) * sizeof *d->v + kvp_prefix_bytes(d->ix)
             : 0;
}

/* Frees the added records that no longer name a source: read since (id ""), or dropped
 * from the index by its bound. */
static void sweep_added(struct kvp_prefix_disk *d)
{
    for (disk_source **p = &d->added; *p;) {
        disk_source *r = *p;
        if (r->id[0] && kvp_prefix_owner_blocks(d->ix, r) > 0) {
            p = &r->next;
            continue;
        }
        if (r->id[0])
            d->live--;
        kvp_prefix_remove(d->ix, r);
        *p = r->next;
        free(r);
        d->n_added--;
    }
}

void hub_prefix_disk_keep(kvp_hub *h, const kvp_session *s)
{
    if (!h->prefix || !h->env.store || !s->has_snapshot || s->res.lost || !s->id[0])
        return;
    int blocks = kvp_prefix_owner_blocks(h->prefix, s);
    uint64_t *chain = blocks > 0 ? malloc((size_t)blocks * sizeof *chain) : NULL;
    if (!chain)
        return;
    blocks = kvp_prefix_owner_chain(h->prefix, s, chain, blocks);
    if (!h->prefix_disk)
        h->prefix_disk = disk_new(0);
    struct kvp_prefix_disk *d = h->prefix_disk;
    disk_source *r = d ? calloc(1, sizeof *r) : NULL;
    if (r) {
        snprintf(r->id, sizeof r->id, "%s", s->id);
        snprintf(r->tenant, sizeof r->tenant, "%s", s->tenant);
        if (kvp_prefix_put_chain(d->ix, r, r->tenant, chain, blocks) == 0) {
            r->next = d->added;
            d->added = r;
            d->n_added++;
            d->live++;
            /* the list stays within twice what the index can still answer for */
            if (d->n_added > 64 && d->n_added > 2 * (d->live - d->n_added + 64))
                sweep_added(d);
        } else {
            free(r);
        }
    }
    free(chain);
}

int hub_prefix_disk_count(const kvp_hub *h)
{
    return h->prefix_disk ? h->prefix_disk->live : 0;
}

/* A parked conversation of the tenant with a snapshot to read, nobody attached to it. */
static int parked_ok(void *ctx, const void *owner)
{
    const hub_source_filter *f = ctx;
    const kvp_session *s = owner;
    return s->state == KVP_SESSION_PARKED && s->has_snapshot && !s->client &&
           !strcmp(s->tenant, f->c->tenant);
}

/* One of the tenant's, not in the table (a session of that id speaks for itself). */
static int disk_ok(void *ctx, const void *owner)
{
    const hub_source_filter *f = ctx;
    const disk_source *d = owner;
    return d->id[0] && !strcmp(d->tenant, f->c->tenant) &&
           !kvp_session_find(&f->h->sessions, d->id);
}

void hub_prefix_far_source(kvp_hub *h, const kvp_hub_client *c, const int *tok, int nt,
                           int have, hub_far_source *far)
{
    memset(far, 0, sizeof *far);
    int parked = h->sessions.count > h->sessions.resident;
    if (!h->prefix || !h->env.store || (!parked && !hub_prefix_disk_count(h)))
        return;
    hub_source_filter f = {h, c};
    int lp = 0, ld = 0;
    kvp_session *ps = parked ? (kvp_session *)kvp_prefix_lookup(h->prefix, c->tenant, tok, nt,
                                                                 parked_ok, &f, &lp) : NULL;
    disk_source *ds = hub_prefix_disk_count(h)
        ? (disk_source *)kvp_prefix_lookup(h->prefix_disk->ix, c->tenant, tok, nt, disk_ok, &f,
                                           &ld)
        : NULL;
    if (ds && ps && lp >= ld)
        ds = NULL;   /* the parked one: in memory already, as long a prefix */
    if ((!ds && !ps) || (ds ? ld : lp) <= have)
        return;
    far->parked = ds ? NULL : ps;
    far->record = ds;
    far->len = ds ? ld : lp;
    snprintf(far->id, sizeof far->id, "%s", ds ? ds->id : ps->id);
}

void hub_prefix_load(kvp_hub_client *c, const hub_far_source *far, kvp_hub_pending *p)
{
    kvp_hub *h = c->hub;
    p->fork = 1;
    kvpd_log("info", "session %.8s: read from its snapshot to be forked (%d tokens in common "
             "with a new conversation)", far->id, far->len);
    hub_open_from_disk(c, far->parked, far->id, NULL, 0);
    if (!c->session || c->session->state != KVP_SESSION_LOAD) {
        hub_pending_free(p);   /* refused (overloaded): answered; the source stays known */
        return;
    }
    c->pending = p;
    disk_source *ds = far->record;
    if (ds) {   /* read once: in memory from now on, or gone */
        kvp_prefix_remove(h->prefix_disk->ix, ds);
        ds->id[0] = '\0';
        h->prefix_disk->live--;
    }
}
