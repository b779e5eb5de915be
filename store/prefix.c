/* The prefix index (store/prefix.h): a chained hash table of block entries, each
 * naming its owner and its depth (block number); owners keep the ids of their entries
 * so that removing one is as cheap as putting it. */
#include "store/prefix.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "base/checksum.h"

typedef struct entry {
    uint64_t hash;
    int32_t owner;   /* index in ix->owners; -1: free */
    int32_t depth;   /* block number (0: tokens 0..15) */
    int32_t next;    /* bucket chain, or the free list */
} entry;

typedef struct owner_rec {
    const void *key;   /* NULL: a free slot */
    uint64_t seed;     /* the tenant's */
    uint64_t used;     /* ix->clock when put or last hit */
    int32_t *ids;      /* [n] the entries of blocks 0..n-1 */
    int n;
} owner_rec;

struct kvp_prefix_index {
    int max_per, max_total;
    entry *e;
    int32_t n_e, cap_e, free_e, live;
    int32_t *bucket;   /* [n_bucket] chain heads, -1: empty */
    uint32_t n_bucket; /* a power of two */
    owner_rec *owners;
    int n_owners;
    uint64_t clock, evictions;
};

static uint64_t tenant_seed(const char *tenant)
{
    const char *t = tenant ? tenant : "";
    uint64_t h = kvp_fnv1a(KVP_FNV1A_INIT, "kvp-prefix\0", 11);
    return kvp_fnv1a(h, t, strlen(t) + 1);   /* the NUL ends it: "a"+"b" is not "ab" */
}

/* A finaliser over FNV: the low bits pick the bucket and need mixing. */
static uint64_t mix(uint64_t x)
{
    x ^= x >> 33;
    x *= 0xff51afd7ed558ccdULL;
    x ^= x >> 33;
    x *= 0xc4ceb9fe1a85ec53ULL;
    return x ^ (x >> 33);
}

static uint64_t block_hash(uint64_t prev, const int *tok)
{
    return mix(kvp_fnv1a(prev, tok, KVP_PREFIX_BLOCK * sizeof *tok));
}

kvp_prefix_index *kvp_prefix_create(int max_per, int max_total)
{
    kvp_prefix_index *ix = calloc(1, sizeof *ix);
    if (!ix)
        return NULL;
    ix->max_per = max_per > 0 ? max_per : KVP_PREFIX_MAX_PER;
    ix->max_total = max_total > 0 ? max_total : KVP_PREFIX_MAX_TOTAL;
    if (ix->max_per > ix->max_total)
        ix->max_per = ix->max_total;
    ix->free_e = -1;
    return ix;
}

void kvp_prefix_free(kvp_prefix_index *ix)
{
    if (!ix)
        return;
    for (int i = 0; i < ix->n_owners; i++)
        free(ix->owners[i].ids);
    free(ix->owners);
    free(ix->e);
    free(ix->bucket);
    free(ix);
}

static int find_owner(const kvp_prefix_index *ix, const void *key)
{
    for (int i = 0; i < ix->n_owners; i++)
        if (ix->owners[i].key == key)
            return i;
    return -1;
}

static void unlink_entry(kvp_prefix_index *ix, int32_t id)
{
    int32_t *p = &ix->bucket[ix->e[id].hash & (ix->n_bucket - 1)];
    while (*p != id)
        p = &ix->e[*p].next;
    *p = ix->e[id].next;
    ix->e[id].owner = -1;
    ix->e[id].next = ix->free_e;
    ix->free_e = id;
    ix->live--;
}

static void drop_owner(kvp_prefix_index *ix, int o)
{
    owner_rec *r = &ix->owners[o];
    for (int i = 0; i < r->n; i++)
        unlink_entry(ix, r->ids[i]);
    free(r->ids);
    memset(r, 0, sizeof *r);
}

void kvp_prefix_remove(kvp_prefix_index *ix, const void *owner)
{
    int o = ix && owner ? find_owner(ix, owner) : -1;
    if (o >= 0)
        drop_owner(ix, o);
}

/* Buckets for at least `want` entries (one per entry at most), rehashing the live ones. */
static int grow_buckets(kvp_prefix_index *ix, int32_t want)
{
    if ((uint32_t)want <= ix->n_bucket)
        return 0;
    uint32_t nb = ix->n_bucket ? ix->n_bucket : 256;
    while (nb < (uint32_t)want)
        nb *= 2;
    int32_t *b = malloc((size_t)nb * sizeof *b);
    if (!b)
        return -ENOMEM;
    for (uint32_t i = 0; i < nb; i++)
        b[i] = -1;
    for (int32_t i = 0; i < ix->n_e; i++) {
        if (ix->e[i].owner < 0)
            continue;
        uint32_t k = (uint32_t)(ix->e[i].hash & (nb - 1));
        ix->e[i].next = b[k];
        b[k] = i;
    }
    free(ix->bucket);
    ix->bucket = b;
    ix->n_bucket = nb;
    return 0;
}

/* Room for `need` more entries: drops the least recently used owners (not `keep`) while
 * the total would pass max_total, then grows the arrays. */
static int make_room(kvp_prefix_index *ix, int need, int keep)
{
    while (ix->live + need > ix->max_total) {
        int lru = -1;
        for (int i = 0; i < ix->n_owners; i++)
            if (i != keep && ix->owners[i].key &&
                (lru < 0 || ix->owners[i].used < ix->owners[lru].used))
                lru = i;
        if (lru < 0)
            return -ENOMEM;   /* cannot happen: need <= max_per <= max_total */
        drop_owner(ix, lru);
        ix->evictions++;
    }
    int32_t free_n = ix->n_e - ix->live;   /* entries on the free list */
    if (need > free_n && ix->n_e + (need - free_n) > ix->cap_e) {
        int32_t cap = ix->cap_e ? ix->cap_e : 256;
        while (cap < ix->n_e + (need - free_n))
            cap *= 2;
        if (cap > ix->max_total)
            cap = ix->max_total;
        entry *e = realloc(ix->e, (size_t)cap * sizeof *e);
        if (!e)
            return -ENOMEM;
        ix->e = e;
        ix->cap_e = cap;
    }
    return grow_buckets(ix, ix->live + need);
}

int kvp_prefix_chain(const char *tenant, const int *tokens, int n, uint64_t *out, int max)
{
    int blocks = n > 0 && tokens ? n / KVP_PREFIX_BLOCK : 0;
    if (blocks > max)
        blocks = max;
    uint64_t h = tenant_seed(tenant);
    for (int b = 0; b < blocks; b++)
        out[b] = h = block_hash(h, tokens + (size_t)b * KVP_PREFIX_BLOCK);
    return blocks > 0 ? blocks : 0;
}

int kvp_prefix_put(kvp_prefix_index *ix, const void *owner, const char *tenant,
                   const int *tokens, int n)
{
    if (!ix || !owner)
        return -EINVAL;
    int blocks = n > 0 && tokens ? n / KVP_PREFIX_BLOCK : 0;
    if (blocks > ix->max_per)
        blocks = ix->max_per;
    if (!blocks) {
        kvp_prefix_remove(ix, owner);
        return 0;
    }
    uint64_t *hs = malloc((size_t)blocks * sizeof *hs);
    if (!hs) {
        kvp_prefix_remove(ix, owner);
        return -ENOMEM;
    }
    kvp_prefix_chain(tenant, tokens, n, hs, blocks);
    int rc = kvp_prefix_put_chain(ix, owner, tenant, hs, blocks);
    free(hs);
    return rc;
}

int kvp_prefix_put_chain(kvp_prefix_index *ix, const void *owner, const char *tenant,
                         const uint64_t *chain, int blocks)
{
    if (!ix || !owner)
        return -EINVAL;
    kvp_prefix_remove(ix, owner);
    if (blocks > ix->max_per)
        blocks = ix->max_per;
    if (blocks <= 0 || !chain)
        return 0;
    int o = find_owner(ix, NULL);   /* a free slot */
    if (o < 0) {
        owner_rec *no = realloc(ix->owners, (size_t)(ix->n_owners + 1) * sizeof *no);
        if (!no)
            return -ENOMEM;
        ix->owners = no;
        o = ix->n_owners++;
        memset(&ix->owners[o], 0, sizeof ix->owners[o]);
    }
    owner_rec *r = &ix->owners[o];
    int32_t *ids = malloc((size_t)blocks * sizeof *ids);
    if (!ids)
        return -ENOMEM;
    r->key = owner;   /* taken, so make_room does not pick the slot */
    int rc = make_room(ix, blocks, o);
    r = &ix->owners[o];
    if (rc) {
        free(ids);
        r->key = NULL;
        return rc;
    }
    r->seed = tenant_seed(tenant);
    r->used = ++ix->clock;
    r->ids = ids;
    for (int b = 0; b < blocks; b++) {
        uint64_t h = chain[b];
        int32_t id;
        if (ix->free_e >= 0) {
            id = ix->free_e;
            ix->free_e = ix->e[id].next;
        } else {
            id = ix->n_e++;
        }
        uint32_t k = (uint32_t)(h & (ix->n_bucket - 1));
        ix->e[id] = (entry){.hash = h, .owner = o, .depth = b, .next = ix->bucket[k]};
        ix->bucket[k] = id;
        ix->live++;
        ids[b] = id;
        r->n = b + 1;
    }
    return 0;
}

const void *kvp_prefix_lookup(kvp_prefix_index *ix, const char *tenant, const int *tokens,
                              int n, kvp_prefix_filter filter, void *ctx, int *len)
{
    *len = 0;
    if (!ix || n <= 0 || !tokens || !ix->live)
        return NULL;
    int blocks = n / KVP_PREFIX_BLOCK;
    if (blocks > ix->max_per)
        blocks = ix->max_per;
    if (!blocks)
        return NULL;
    uint64_t seed = tenant_seed(tenant);
    uint64_t *hs = malloc((size_t)blocks * sizeof *hs);
    if (!hs)
        return NULL;
    kvp_prefix_chain(tenant, tokens, n, hs, blocks);
    /* deepest first: a hit at block b covers every block before it */
    int best = -1;
    for (int b = blocks - 1; b >= 0 && best < 0; b--) {
        for (int32_t id = ix->bucket[hs[b] & (ix->n_bucket - 1)]; id >= 0; id = ix->e[id].next) {
            const entry *e = &ix->e[id];
            if (e->hash != hs[b] || e->depth != b)
                continue;
            const owner_rec *r = &ix->owners[e->owner];
            if (r->seed != seed || (filter && !filter(ctx, r->key)))
                continue;
            if (best < 0 || r->used > ix->owners[best].used)
                best = e->owner;
        }
        if (best >= 0)
            *len = (b + 1) * KVP_PREFIX_BLOCK;
    }
    free(hs);
    if (best < 0)
        return NULL;
    ix->owners[best].used = ++ix->clock;
    return ix->owners[best].key;
}

size_t kvp_prefix_bytes(const kvp_prefix_index *ix)
{
    if (!ix)
        return 0;
    size_t b = sizeof *ix + (size_t)ix->cap_e * sizeof(entry) +
               (size_t)ix->n_bucket * sizeof(int32_t) + (size_t)ix->n_owners * sizeof(owner_rec);
    for (int i = 0; i < ix->n_owners; i++)
        b += (size_t)ix->owners[i].n * sizeof(int32_t);
    return b;
}

size_t kvp_prefix_blocks(const kvp_prefix_index *ix)
{
    return ix ? (size_t)ix->live : 0;
}

int kvp_prefix_owner_blocks(const kvp_prefix_index *ix, const void *owner)
{
    int o = ix && owner ? find_owner(ix, owner) : -1;
    return o >= 0 ? ix->owners[o].n : 0;
}

int kvp_prefix_owner_chain(const kvp_prefix_index *ix, const void *owner, uint64_t *out,
                           int max)
{
    int o = ix && owner ? find_owner(ix, owner) : -1;
    int n = 0;
    for (; o >= 0 && n < ix->owners[o].n && n < max; n++)
        out[n] = ix->e[ix->owners[o].ids[n]].hash;
    return n;
}

uint64_t kvp_prefix_evictions(const kvp_prefix_index *ix)
{
    return ix ? ix->evictions : 0;
}
