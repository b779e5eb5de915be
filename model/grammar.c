/* The grammar builder and the incremental matcher (model/grammar.h). A step from a set
 * of threads takes every byte arc that holds the byte, then closes the result over
 * epsilon arcs, calls (a new frame holding the return state) and rule ends (the frame's
 * return state, or the document's end at the root). Threads with the same state and
 * equal stacks are kept once, so an ambiguous grammar does not multiply them. */
#include "model/grammar.h"

#include <errno.h>
#include <limits.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

enum { ARC_RANGE = 0, ARC_EPS = 1, ARC_CALL = 2 };
enum { ST_END = 1, ST_BYTES = 2, ST_PLAIN = 4 };   /* PLAIN: byte arcs only, no end */

typedef struct garc {
    uint8_t kind, lo, hi;
    int32_t to, call;          /* call: the rule's start state */
} garc;

typedef struct barc {
    int32_t from;
    garc a;
} barc;

struct kvp_gbuild {
    int n_states, cap_states;
    uint8_t *flags;
    uint16_t *fanout;          /* arcs out of each state, up to KVP_GRAMMAR_MAX_FANOUT */
    barc *arcs;
    size_t n_arcs, cap_arcs;
    int failed;
};

struct kvp_grammar {
    atomic_int refs;
    int n_states;
    int root;
    uint8_t *flags;
    int32_t *arc_off;          /* [n_states + 1] */
    garc *arcs;
    int32_t *dist;             /* [n_states] bytes to finish the state's rule */
};

kvp_gbuild *kvp_gbuild_new(void)
{
    return calloc(1, sizeof(kvp_gbuild));
}

void kvp_gbuild_free(kvp_gbuild *b)
{
    if (!b)
        return;
    free(b->flags);
    free(b->fanout);
    free(b->arcs);
    free(b);
}

int kvp_gbuild_failed(const kvp_gbuild *b)
{
    return b->failed;
}

int kvp_gbuild_count(const kvp_gbuild *b)
{
    return b->n_states;
}

int kvp_gbuild_state(kvp_gbuild *b)
{
    if (b->failed)
        return -1;
    if (b->n_states >= KVP_GRAMMAR_MAX_STATES) {
        b->failed = -E2BIG;
        return -1;
    }
    if (b->n_states == b->cap_states) {
        int cap = b->cap_states ? b->cap_states * 2 : 256;
        uint8_t *f = realloc(b->flags, (size_t)cap);
        if (f)
            b->flags = f;
        uint16_t *fo = realloc(b->fanout, (size_t)cap * sizeof *fo);
        if (fo)
            b->fanout = fo;
        if (!f || !fo) {
            b->failed = -ENOMEM;
            return -1;
        }
        b->cap_states = cap;
    }
    b->flags[b->n_states] = 0;
    b->fanout[b->n_states] = 0;
    return b->n_states++;
}

static void add_arc(kvp_gbuild *b, int from, garc a)
{
    if (b->failed || from < 0 || from >= b->n_states || a.to < 0 || a.to >= b->n_states ||
        (a.kind == ARC_CALL && (a.call < 0 || a.call >= b->n_states))) {
        if (!b->failed)
            b->failed = -EINVAL;
        return;
    }
    if (b->n_arcs >= KVP_GRAMMAR_MAX_ARCS || b->fanout[from] >= KVP_GRAMMAR_MAX_FANOUT) {
        b->failed = b->n_arcs >= KVP_GRAMMAR_MAX_ARCS ? -EFBIG : -EMLINK;
        return;
    }
    if (b->n_arcs == b->cap_arcs) {
        size_t cap = b->cap_arcs ? b->cap_arcs * 2 : 512;
        barc *v = realloc(b->arcs, cap * sizeof *v);
        if (!v) {
            b->failed = -ENOMEM;
            return;
        }
        b->arcs = v;
        b->cap_arcs = cap;
    }
    b->arcs[b->n_arcs++] = (barc){from, a};
    b->fanout[from]++;
    if (a.kind == ARC_RANGE)
        b->flags[from] |= ST_BYTES;
}

void kvp_gbuild_range(kvp_gbuild *b, int from, unsigned lo, unsigned hi, int to)
{
    if (lo > hi || hi > 255) {
        b->failed = b->failed ? b->failed : -EINVAL;
        return;
    }
    add_arc(b, from, (garc){ARC_RANGE, (uint8_t)lo, (uint8_t)hi, to, 0});
}

void kvp_gbuild_eps(kvp_gbuild *b, int from, int to)
{
    add_arc(b, from, (garc){ARC_EPS, 0, 0, to, 0});
}

void kvp_gbuild_call(kvp_gbuild *b, int from, int start, int ret)
{
    add_arc(b, from, (garc){ARC_CALL, 0, 0, ret, start});
}

void kvp_gbuild_end(kvp_gbuild *b, int state)
{
    if (!b->failed && state >= 0 && state < b->n_states)
        b->flags[state] |= ST_END;
}

int kvp_gbuild_literal(kvp_gbuild *b, int from, const char *s, size_t len)
{
    int at = from;
    for (size_t i = 0; i < len && at >= 0; i++) {
        int next = kvp_gbuild_state(b);
        if (next < 0)
            return -1;
        kvp_gbuild_range(b, at, (uint8_t)s[i], (uint8_t)s[i], next);
        at = next;
    }
    return b->failed ? -1 : at;
}

/* Drops the arcs into states from which no rule end can be reached (a branch that could
 * never be finished, such as a property required to hold itself): a matcher then never
 * enters a path without a way out. 0, -ENOMEM, or -ENOENT when the root has no finite
 * document at all. */
static int prune(kvp_grammar *g)
{
    uint8_t *prod = calloc((size_t)g->n_states, 1);
    if (!prod)
        return -ENOMEM;
    for (int s = 0; s < g->n_states; s++)
        prod[s] = (g->flags[s] & ST_END) != 0;
    /* Paths are mostly built toward higher state numbers: passes from the top converge in
     * a few; a state still open after the last pass is taken as unproductive (safe: its
     * documents are dropped, never invented). */
    for (int pass = 0, changed = 1; changed && pass < 256; pass++) {
        changed = 0;
        for (int s = g->n_states - 1; s >= 0; s--) {
            if (prod[s])
                continue;
            for (int32_t a = g->arc_off[s]; a < g->arc_off[s + 1]; a++) {
                const garc *arc = &g->arcs[a];
                if (prod[arc->to] && (arc->kind != ARC_CALL || prod[arc->call])) {
                    prod[s] = changed = 1;
                    break;
                }
            }
        }
    }
    int32_t k = 0;
    for (int s = 0; s < g->n_states; s++) {
        int32_t from = g->arc_off[s], to = g->arc_off[s + 1];
        g->arc_off[s] = k;
        g->flags[s] &= (uint8_t)~ST_BYTES;
        for (int32_t a = from; a < to; a++) {
            const garc *arc = &g->arcs[a];
            if (!prod[s] || !prod[arc->to] || (arc->kind == ARC_CALL && !prod[arc->call]))
                continue;
            if (arc->kind == ARC_RANGE)
                g->flags[s] |= ST_BYTES;
            g->arcs[k++] = *arc;
        }
    }
    g->arc_off[g->n_states] = k;
    int ok = prod[g->root];
    free(prod);
    return ok ? 0 : -ENOENT;
}

/* ---- distances ---- */

static int32_t dist_add(int32_t a, int32_t b)
{
    return a >= KVP_GRAMMAR_FAR - b ? KVP_GRAMMAR_FAR : a + b;
}

typedef struct hent {
    int32_t d, s;
} hent;

static void heap_push(hent *h, int *n, hent e)
{
    int i = (*n)++;
    while (i > 0 && h[(i - 1) / 2].d > e.d) {
        h[i] = h[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    h[i] = e;
}

static hent heap_pop(hent *h, int *n)
{
    hent top = h[0], last = h[--*n];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= *n)
            break;
        if (c + 1 < *n && h[c + 1].d < h[c].d)
            c++;
        if (h[c].d >= last.d)
            break;
        h[i] = h[c];
        i = c;
    }
    if (*n > 0)
        h[i] = last;
    return top;
}

/* The value of arc a for its source state when its targets' distances are final (else
 * FAR); a byte arc counts only when one of its bytes is in lone (NULL: every byte). */
static int32_t arc_value(const kvp_grammar *g, const garc *a, const int32_t *d,
                         const uint8_t *fin, const uint32_t *lone)
{
    if (!fin[a->to])
        return KVP_GRAMMAR_FAR;
    if (a->kind == ARC_EPS)
        return d[a->to];
    if (a->kind == ARC_CALL)
        return fin[a->call] ? dist_add(d[a->call], d[a->to]) : KVP_GRAMMAR_FAR;
    if (lone) {
        unsigned b = a->lo;
        while (b <= a->hi && !((lone[b >> 5] >> (b & 31)) & 1))
            b++;
        if (b > a->hi)
            return KVP_GRAMMAR_FAR;
    }
    (void)g;
    return dist_add(d[a->to], 1);
}

/* Each state's fewest steps to its rule's end: Knuth's generalization of Dijkstra's
 * shortest paths (a call's value is the sum of two distances, both at least the arc's
 * source's lower bound), states settled in order of distance, an arc relaxed once all the
 * states it names are settled. A step is a byte; with run (see run_costs) a state that
 * starts a run of forced bytes goes to the run's end in run->cost[s] steps instead (the
 * fewest tokens spelling those bytes). NULL when out of memory. */
typedef struct runs {
    int32_t *cost, *end;   /* [n_states]; cost -1: not in a run */
} runs;

static int32_t *distances(const kvp_grammar *g, const uint32_t *lone, const runs *run)
{
    int n = g->n_states;
    int32_t na = g->arc_off[n];
    int32_t *d = malloc((size_t)n * sizeof *d);
    uint8_t *fin = calloc((size_t)n, 1);
    int32_t *roff = calloc((size_t)n + 1, sizeof *roff);
    /* reverse arcs: for every state, the arcs naming it (as target or as called rule) */
    int32_t *rarc = malloc(((size_t)2 * (size_t)na + 1) * sizeof *rarc);
    int32_t *rfrom = malloc(((size_t)2 * (size_t)na + 1) * sizeof *rfrom);
    hent *h = malloc(((size_t)2 * (size_t)na + (size_t)n + 1) * sizeof *h);
    int hn = 0;
    if (!d || !fin || !roff || !rarc || !rfrom || !h)
        goto fail;
    /* a run's state is named by its run's end (through its one arc, see below) */
#define TARGET(s, arc) (run && run->cost[s] >= 0 ? run->end[s] : (arc)->to)
    for (int s = 0; s < n; s++)
        for (int32_t a = g->arc_off[s]; a < g->arc_off[s + 1]; a++) {
            roff[TARGET(s, &g->arcs[a]) + 1]++;
            if (g->arcs[a].kind == ARC_CALL && g->arcs[a].call != g->arcs[a].to)
                roff[g->arcs[a].call + 1]++;
        }
    for (int s = 0; s < n; s++)
        roff[s + 1] += roff[s];
    int32_t *fill = malloc(((size_t)n + 1) * sizeof *fill);
    if (!fill)
        goto fail;
    memcpy(fill, roff, ((size_t)n + 1) * sizeof *fill);
    for (int s = 0; s < n; s++)
        for (int32_t a = g->arc_off[s]; a < g->arc_off[s + 1]; a++) {
            const garc *arc = &g->arcs[a];
            int32_t to = TARGET(s, arc);
            rarc[fill[to]] = a;
            rfrom[fill[to]++] = s;
            if (arc->kind == ARC_CALL && arc->call != arc->to) {
                rarc[fill[arc->call]] = a;
                rfrom[fill[arc->call]++] = s;
            }
        }
    free(fill);
    for (int s = 0; s < n; s++) {
        d[s] = KVP_GRAMMAR_FAR;
        if (g->flags[s] & ST_END) {
            d[s] = 0;
            heap_push(h, &hn, (hent){0, s});
        }
    }
    while (hn > 0) {
        hent e = heap_pop(h, &hn);
        if (fin[e.s] || e.d != d[e.s])
            continue;
        fin[e.s] = 1;
        for (int32_t k = roff[e.s]; k < roff[e.s + 1]; k++) {
            int32_t p = rfrom[k];
            if (fin[p])
                continue;
            int32_t v = run && run->cost[p] >= 0
                        ? dist_add(run->cost[p], d[run->end[p]])
                        : arc_value(g, &g->arcs[rarc[k]], d, fin, lone);
            if (v < d[p]) {
                d[p] = v;
                heap_push(h, &hn, (hent){v, p});
            }
        }
    }
#undef TARGET
    free(fin);
    free(roff);
    free(rarc);
    free(rfrom);
    free(h);
    return d;
fail:
    free(d);
    free(fin);
    free(roff);
    free(rarc);
    free(rfrom);
    free(h);
    return NULL;
}

int kvp_grammar_min_len(const kvp_grammar *g)
{
    return g->dist[g->root];
}

kvp_grammar *kvp_grammar_finish(kvp_gbuild *b, int root, int *rc)
{
    kvp_grammar *g = NULL;
    *rc = b->failed ? b->failed : -EINVAL;
    if (b->failed || root < 0 || root >= b->n_states)
        goto out;
    *rc = -ENOMEM;
    g = calloc(1, sizeof *g);
    if (!g)
        goto out;
    /* one reference from the start, so every error path below frees with unref */
    atomic_init(&g->refs, 1);
    g->n_states = b->n_states;
    g->root = root;
    g->flags = malloc((size_t)b->n_states);
    g->arc_off = calloc((size_t)b->n_states + 1, sizeof *g->arc_off);
    g->arcs = malloc((b->n_arcs ? b->n_arcs : 1) * sizeof *g->arcs);
    if (!g->flags || !g->arc_off || !g->arcs) {
        free(g->flags);
        free(g->arc_off);
        free(g->arcs);
        free(g);
        g = NULL;
        goto out;
    }
    memcpy(g->flags, b->flags, (size_t)b->n_states);
    for (size_t i = 0; i < b->n_arcs; i++)
        g->arc_off[b->arcs[i].from + 1]++;
    for (int i = 0; i < b->n_states; i++)
        g->arc_off[i + 1] += g->arc_off[i];
    /* counting sort by source state, in the order the arcs were made */
    int32_t *fill = malloc((size_t)b->n_states * sizeof *fill);
    if (!fill) {
        kvp_grammar_unref(g);
        g = NULL;
        goto out;
    }
    memcpy(fill, g->arc_off, (size_t)b->n_states * sizeof *fill);
    for (size_t i = 0; i < b->n_arcs; i++)
        g->arcs[fill[b->arcs[i].from]++] = b->arcs[i].a;
    free(fill);
    if ((*rc = prune(g)) < 0) {
        kvp_grammar_unref(g);
        g = NULL;
        goto out;
    }
    for (int s = 0; s < g->n_states; s++) {
        int plain = (g->flags[s] & (ST_BYTES | ST_END)) == ST_BYTES;
        for (int32_t a = g->arc_off[s]; a < g->arc_off[s + 1] && plain; a++)
            plain = g->arcs[a].kind == ARC_RANGE;
        if (plain)
            g->flags[s] |= ST_PLAIN;
    }
    if (!(g->dist = distances(g, NULL, NULL))) {
        *rc = -ENOMEM;
        kvp_grammar_unref(g);
        g = NULL;
    }
out:
    kvp_gbuild_free(b);
    return g;
}

kvp_grammar *kvp_grammar_ref(kvp_grammar *g)
{
    if (g)
        atomic_fetch_add(&g->refs, 1);
    return g;
}

void kvp_grammar_unref(kvp_grammar *g)
{
    if (!g || atomic_fetch_sub(&g->refs, 1) != 1)
        return;
    free(g->flags);
    free(g->arc_off);
    free(g->arcs);
    free(g->dist);
    free(g);
}

int kvp_grammar_states(const kvp_grammar *g)
{
    return g->n_states;
}

/* ---- the matcher ---- */

/* STEP_WORK (model/grammar.h KVP_GRAMMAR_STEP_WORK): the units one step (one byte from
 * a set of threads, with its closure) may take, a backstop against grammars whose closure
 * explodes. The same cap holds in a mask and in an accept, so both compute the same sets
 * from the same threads. */
#define STEP_WORK KVP_GRAMMAR_STEP_WORK
/* The units a closure costs before its first expansion (the call, its work list, the
 * visit marks): about what testing that many arcs takes. */
#define CLOSURE_CALL 8

/* The matcher's closure scratch: a work list and the states visited in this step. */
typedef struct gwork {
    kvp_gthread *todo;
    int n, cap;
    uint32_t *stamp;           /* [n_states] step number of the last visit */
    int32_t *vframe;           /* [n_states] the frame it was visited with */
    uint32_t now;
} gwork;

static uint32_t frame_hash(int32_t ret, int32_t parent)
{
    uint32_t h = (uint32_t)ret * 0x9E3779B1u ^ ((uint32_t)parent + 0x7F4A7C15u) * 0x85EBCA77u;
    return h ^ (h >> 15);
}

/* Rebuilds the frame table from the frames in use (dropping entries of frames gone),
 * twice as large as needed. -1 when out of memory. */
static int frames_rehash(kvp_gmatch *m)
{
    int cap = 1024;
    while (cap < 4 * (m->n_frames + 1))
        cap *= 2;
    int32_t *t = malloc((size_t)cap * sizeof *t);
    if (!t)
        return -1;
    for (int i = 0; i < cap; i++)
        t[i] = -1;
    for (int f = 0; f < m->n_frames; f++) {
        uint32_t h = frame_hash(m->ret[f], m->parent[f]) & (uint32_t)(cap - 1);
        while (t[h] >= 0)
            h = (h + 1) & (uint32_t)(cap - 1);
        t[h] = f;
    }
    free(m->htab);
    m->htab = t;
    m->hcap = cap;
    m->hused = m->n_frames;
    return 0;
}

/* The frame (ret on top of parent), made once: frames are hash-consed, so two threads have
 * the same stack exactly when they have the same frame index. An entry of the table may
 * name a frame past n_frames (dropped since, or made again with other contents): lookups
 * compare contents and take such a slot for a new entry. -1 out of memory, -2 too deep. */
static int frame_new(kvp_gmatch *m, int32_t ret, int32_t parent)
{
    int d = parent < 0 ? 1 : m->depth[parent] + 1;
    if (d > KVP_GRAMMAR_MAX_DEPTH)
        return -2;
    if (2 * (m->hused + 1) > m->hcap && frames_rehash(m) < 0)
        return -1;
    uint32_t hm = (uint32_t)(m->hcap - 1), h = frame_hash(ret, parent) & hm;
    int32_t slot = -1;
    for (;; h = (h + 1) & hm) {
        int32_t f = m->htab[h];
        m->work++;
        if (f < 0)
            break;
        if (f < m->n_frames) {
            if (m->ret[f] == ret && m->parent[f] == parent)
                return f;
        } else if (slot < 0)
            slot = (int32_t)h;
    }
    if (m->n_frames == m->cap_frames) {
        int cap = m->cap_frames * 2;
        int32_t *r = realloc(m->ret, (size_t)cap * sizeof *r);
        if (r)
            m->ret = r;
        int32_t *p = realloc(m->parent, (size_t)cap * sizeof *p);
        if (p)
            m->parent = p;
        uint16_t *dp = realloc(m->depth, (size_t)cap * sizeof *dp);
        if (dp)
            m->depth = dp;
        int32_t *fd = realloc(m->fdist, (size_t)cap * sizeof *fd);
        if (fd)
            m->fdist = fd;
        if (!r || !p || !dp || !fd)
            return -1;
        m->cap_frames = cap;
    }
    if (slot < 0) {
        slot = (int32_t)h;
        m->hused++;
    }
    m->htab[slot] = m->n_frames;
    m->ret[m->n_frames] = ret;
    m->parent[m->n_frames] = parent;
    m->depth[m->n_frames] = (uint16_t)d;
    m->fdist[m->n_frames] = dist_add(m->dist[ret], parent < 0 ? 0 : m->fdist[parent]);
    return m->n_frames++;
}

static gwork *work_of(kvp_gmatch *m);
static void cache_clear(kvp_gmatch *m);
static void cache_free(kvp_gmatch *m);

static int push(gwork *w, int32_t st, int32_t fr)
{
    if (w->n == w->cap) {
        int cap = w->cap * 2;
        kvp_gthread *v = realloc(w->todo, (size_t)cap * sizeof *v);
        if (!v)
            return -1;
        w->todo = v;
        w->cap = cap;
    }
    w->todo[w->n++] = (kvp_gthread){st, fr};
    return 0;
}

/* Adds th to out unless a thread of the same state and stack is there (each one compared
 * is a unit) or out is full. */
static void add_thread(kvp_gmatch *m, kvp_gset *out, kvp_gthread th)
{
    if (out->n == KVP_GRAMMAR_MAX_THREADS)   /* full: dropped either way */
        return;
    m->work += out->n;
    for (int i = 0; i < out->n; i++)
        if (out->t[i].state == th.state && out->t[i].frame == th.frame)
            return;
    if (out->n < KVP_GRAMMAR_MAX_THREADS)
        out->t[out->n++] = th;
}

/* Adds (st, fr) and everything it reaches without a byte to out, until the work counter
 * reaches stop (what is added by then is a part of the whole: still only real threads).
 * -ENOMEM or 0. */
static int closure(kvp_gmatch *m, kvp_gset *out, int32_t st, int32_t fr, long stop)
{
    const kvp_grammar *g = m->g;
    gwork *w = work_of(m);
    w->n = 0;
    m->work += CLOSURE_CALL;
    if (push(w, st, fr) < 0)
        return -ENOMEM;
    while (w->n > 0 && m->work < stop) {
        kvp_gthread th = w->todo[--w->n];
        m->work++;
        if (w->stamp[th.state] == w->now && w->vframe[th.state] == th.frame)
            continue;
        w->stamp[th.state] = w->now;
        w->vframe[th.state] = th.frame;
        uint8_t f = g->flags[th.state];
        if (f & ST_END) {
            if (th.frame < 0)
                out->complete = 1;
            else if (push(w, m->ret[th.frame], m->parent[th.frame]) < 0)
                return -ENOMEM;
        }
        if (f & ST_BYTES)
            add_thread(m, out, th);
        m->work += g->arc_off[th.state + 1] - g->arc_off[th.state];
        for (int32_t a = g->arc_off[th.state]; a < g->arc_off[th.state + 1]; a++) {
            const garc *arc = &g->arcs[a];
            if (arc->kind == ARC_EPS) {
                if (push(w, arc->to, th.frame) < 0)
                    return -ENOMEM;
            } else if (arc->kind == ARC_CALL) {
                if (m->work >= stop)
                    break;
                int nf = frame_new(m, arc->to, th.frame);
                if (nf == -1)
                    return -ENOMEM;
                if (nf >= 0 && push(w, arc->call, nf) < 0)
                    return -ENOMEM;
            }
        }
    }
    return 0;
}

/* out = where byte leads from in, within STEP_WORK units and the mask's limit (a step
 * stopped by either keeps what it found). -ENOMEM or 0. */
static int step(kvp_gmatch *m, const kvp_gset *in, uint8_t byte, kvp_gset *out)
{
    const kvp_grammar *g = m->g;
    gwork *w = work_of(m);
    out->n = 0;
    out->complete = 0;
    if (++w->now == 0) {   /* wrapped: forget every stamp */
        memset(w->stamp, 0, (size_t)g->n_states * sizeof *w->stamp);
        w->now = 1;
    }
    long stop = m->work + STEP_WORK;
    if (stop > m->limit)
        stop = m->limit;
    /* the plain path counts in a local, added to m->work before a closure and at the end */
    long work = 0;
    for (int i = 0; i < in->n && m->work + work < stop; i++) {
        int32_t s = in->t[i].state, fr = in->t[i].frame;
        int32_t a0 = g->arc_off[s], a1 = g->arc_off[s + 1];
        work += a1 - a0;
        for (int32_t a = a0; a < a1; a++) {
            const garc *arc = &g->arcs[a];
            if (arc->kind != ARC_RANGE || byte < arc->lo || byte > arc->hi)
                continue;
            if (g->flags[arc->to] & ST_PLAIN) {   /* nothing to close over (most bytes) */
                int k = 0, n = out->n;
                if (n == KVP_GRAMMAR_MAX_THREADS)   /* full: dropped either way */
                    continue;
                while (k < n && (out->t[k].state != arc->to || out->t[k].frame != fr))
                    k++;
                work += n;
                if (k == n && n < KVP_GRAMMAR_MAX_THREADS)
                    out->t[out->n++] = (kvp_gthread){arc->to, fr};
                continue;
            }
            m->work += work;
            work = 0;
            if (closure(m, out, arc->to, fr, stop) < 0)
                return -ENOMEM;
        }
    }
    m->work += work;
    return 0;
}

/* step() for the walk: one thread whose byte arcs lead only to plain states (most of a
 * walk, inside strings and numbers) is stepped here, without a closure's setup; the same
 * set and the same units as step(). */
static int walk_step(kvp_gmatch *m, const kvp_gset *in, uint8_t byte, kvp_gset *out)
{
    if (in->n != 1)
        return step(m, in, byte, out);
    const kvp_grammar *g = m->g;
    int32_t s = in->t[0].state, fr = in->t[0].frame;
    int32_t a0 = g->arc_off[s], a1 = g->arc_off[s + 1];
    int n = 0;
    kvp_gthread t[4];
    for (int32_t a = a0; a < a1; a++) {
        const garc *arc = &g->arcs[a];
        if (arc->kind != ARC_RANGE || byte < arc->lo || byte > arc->hi)
            continue;
        if (!(g->flags[arc->to] & ST_PLAIN) || n == 4)
            return step(m, in, byte, out);
        int k = 0;
        while (k < n && t[k].state != arc->to)
            k++;
        m->work += n;
        if (k == n)
            t[n++] = (kvp_gthread){arc->to, fr};
    }
    m->work += a1 - a0;
    out->complete = 0;
    out->n = n;
    for (int k = 0; k < n; k++)
        out->t[k] = t[k];
    return 0;
}

static gwork *work_of(kvp_gmatch *m)
{
    return (gwork *)(void *)m->scratch;
}

int kvp_gmatch_init(kvp_gmatch *m, kvp_grammar *g)
{
    memset(m, 0, sizeof *m);
    m->limit = LONG_MAX;
    gwork *w = calloc(1, sizeof *w);
    m->cap_frames = 256;
    m->ret = malloc((size_t)m->cap_frames * sizeof *m->ret);
    m->parent = malloc((size_t)m->cap_frames * sizeof *m->parent);
    m->depth = malloc((size_t)m->cap_frames * sizeof *m->depth);
    m->fdist = malloc((size_t)m->cap_frames * sizeof *m->fdist);
    m->dist = g->dist;
    m->scratch = w;
    if (w) {
        w->cap = 64;
        w->todo = malloc((size_t)w->cap * sizeof *w->todo);
        w->stamp = calloc((size_t)g->n_states, sizeof *w->stamp);
        w->vframe = malloc((size_t)g->n_states * sizeof *w->vframe);
        w->now = 1;
    }
    m->g = kvp_grammar_ref(g);
    if (!w || !w->todo || !w->stamp || !w->vframe || !m->ret || !m->parent || !m->depth || !m->fdist ||
        frames_rehash(m) < 0) {
        kvp_gmatch_free(m);
        return -ENOMEM;
    }
    m->cur.n = 0;
    m->cur.complete = 0;
    if (closure(m, &m->cur, g->root, -1, m->work + STEP_WORK) < 0) {
        kvp_gmatch_free(m);
        return -ENOMEM;
    }
    return 0;
}

void kvp_gmatch_free(kvp_gmatch *m)
{
    gwork *w = m->scratch;
    if (w) {
        free(w->todo);
        free(w->stamp);
        free(w->vframe);
        free(w);
    }
    free(m->ret);
    free(m->parent);
    free(m->depth);
    free(m->fdist);
    free(m->own_dist);
    cache_free(m);
    free(m->htab);
    free(m->level);
    kvp_grammar_unref(m->g);
    memset(m, 0, sizeof *m);
}

/* Copies the frames the current threads use to the arena's start, dropping the rest. */
static void compact(kvp_gmatch *m)
{
    int32_t *map = malloc((size_t)m->n_frames * sizeof *map);
    int32_t *r = malloc((size_t)m->n_frames * sizeof *r), *p = malloc((size_t)m->n_frames * sizeof *p);
    uint16_t *d = malloc((size_t)m->n_frames * sizeof *d);
    int32_t *fd = malloc((size_t)m->n_frames * sizeof *fd);
    if (!map || !r || !p || !d || !fd)
        goto out;
    for (int i = 0; i < m->n_frames; i++)
        map[i] = -1;
    /* frames are made after their parents: copying in index order keeps that */
    int n = 0;
    char *live = calloc((size_t)m->n_frames, 1);
    if (!live)
        goto out;
    for (int i = 0; i < m->cur.n; i++)
        for (int32_t f = m->cur.t[i].frame; f >= 0 && !live[f]; f = m->parent[f])
            live[f] = 1;
    for (int i = 0; i < m->n_frames; i++)
        if (live[i]) {
            map[i] = n;
            r[n] = m->ret[i];
            p[n] = m->parent[i] < 0 ? -1 : map[m->parent[i]];
            d[n] = m->depth[i];
            fd[n] = m->fdist[i];
            n++;
        }
    free(live);
    for (int i = 0; i < m->cur.n; i++)
        if (m->cur.t[i].frame >= 0)
            m->cur.t[i].frame = map[m->cur.t[i].frame];
    memcpy(m->ret, r, (size_t)n * sizeof *r);
    memcpy(m->parent, p, (size_t)n * sizeof *p);
    memcpy(m->depth, d, (size_t)n * sizeof *d);
    memcpy(m->fdist, fd, (size_t)n * sizeof *fd);
    m->n_frames = n;
    cache_clear(m);   /* its keys name the old frame indices */
    /* the table's entries name the old indices; with no memory for a new one, every
     * entry is dropped (a frame made again is then a second copy: threads with it are
     * kept apart, which costs room, never a document) */
    if (frames_rehash(m) < 0) {
        for (int i = 0; i < m->hcap; i++)
            m->htab[i] = -1;
        m->hused = 0;
    }
out:
    free(map);
    free(r);
    free(p);
    free(d);
    free(fd);
}

int kvp_gmatch_accept(kvp_gmatch *m, const char *bytes, size_t len)
{
    kvp_gset *a = malloc(2 * sizeof *a);
    if (!a)
        return -ENOMEM;
    int mark = m->n_frames, rc = 0;
    kvp_gset *from = &m->cur, *to = &a[0];
    for (size_t i = 0; i < len; i++) {
        if ((rc = step(m, from, (uint8_t)bytes[i], to)) < 0)
            break;
        if (to->n == 0 && (!to->complete || i + 1 < len)) {
            rc = -EINVAL;
            break;
        }
        from = to;
        to = to == &a[0] ? &a[1] : &a[0];
    }
    if (rc < 0)
        m->n_frames = mark;
    else if (from != &m->cur)
        m->cur = *from;
    free(a);
    if (rc == 0 && m->n_frames > 65536)
        compact(m);
    return rc;
}

int kvp_gmatch_complete(const kvp_gmatch *m)
{
    return m->cur.complete;
}

int kvp_gmatch_closed(const kvp_gmatch *m)
{
    return m->cur.n == 0;
}

/* Marks the tokens of node i; 1 when it has any. */
static int mark(const kvp_vocab_trie *tr, int i, uint32_t *mask)
{
    for (int32_t k = tr->off[i]; k < tr->off[i + 1]; k++)
        mask[tr->tok[k] >> 5] |= 1u << (tr->tok[k] & 31);
    return tr->off[i + 1] > tr->off[i];
}

long kvp_grammar_mask_budget(const kvp_vocab_trie *tr)
{
    return KVP_GRAMMAR_WORK_PER_NODE * tr->n_nodes + KVP_GRAMMAR_WORK_BASE;
}

/* A set's distance: 0 when whole, else its nearest thread's (state and stack). */
static int32_t set_dist(const kvp_gmatch *m, const kvp_gset *st)
{
    if (st->complete)
        return 0;
    int32_t best = KVP_GRAMMAR_FAR;
    for (int i = 0; i < st->n; i++) {
        int32_t fr = st->t[i].frame;
        int32_t v = dist_add(m->dist[st->t[i].state], fr < 0 ? 0 : m->fdist[fr]);
        best = v < best ? v : best;
    }
    return best;
}

int kvp_gmatch_distance(const kvp_gmatch *m)
{
    return set_dist(m, &m->cur);
}

/* The walk's budget: left tokens to go (< 0: none), the largest distance after a token
 * the grammar allowed, and whether a token was marked. */
typedef struct wbudget {
    int left;
    int32_t maxd;
    int marked;
    /* the tokens the grammar allows that lead farther than the set's own distance base,
     * with their distances (n of cap; full: some did not fit) */
    int32_t base;
    int32_t (*far)[2];
    int n_far, cap_far, full;
} wbudget;

/* Marks node i's tokens when the document can be finished after them in the tokens left
 * (out: the set they lead to); 1 when it marked any. record: note the ones leading
 * farther than wb->base. */
static int take(kvp_gmatch *m, const kvp_vocab_trie *tr, int i, const kvp_gset *out,
                uint32_t *mask, wbudget *wb, int record)
{
    if (tr->off[i + 1] == tr->off[i])
        return 0;
    int32_t d = set_dist(m, out);
    wb->maxd = d > wb->maxd ? d : wb->maxd;
    if (record && d > wb->base)
        for (int32_t k = tr->off[i]; k < tr->off[i + 1]; k++) {
            if (wb->n_far == wb->cap_far) {
                wb->full = 1;
                break;
            }
            wb->far[wb->n_far][0] = tr->tok[k];
            wb->far[wb->n_far++][1] = d;
        }
    if (wb->left >= 0 && d > wb->left - 1) {
        m->shaped = 1;
        return 0;
    }
    wb->marked = 1;
    return mark(tr, i, mask);
}

/* The mask's walk, bounded: the work counter's limit is the budget of kvp_grammar.h
 * (KVP_GRAMMAR_WORK_PER_NODE per trie node plus KVP_GRAMMAR_WORK_BASE), so a hostile
 * grammar costs a request at most a few times what a whole walk of the same trie costs
 * a plain one, whatever the schema. Every step and closure stops at the limit with what
 * it found (real threads only), so the tokens marked are valid either way; the one-byte
 * tokens go first, so a cut walk still offers as many of the bytes that may come next as
 * the budget reached. When the budget ran out before any token was found, one more step
 * (within STEP_WORK) tries the first byte that may come next, so a document that can go
 * on has a token to go on with. With a length budget, when no token fitting it was found
 * (a cut walk), the one-byte tokens are stepped once more without the work limit until
 * one fits (the shortest way on starts with a byte that has one), else the nearest one
 * is offered. */
static int walk(kvp_gmatch *m, const kvp_vocab_trie *tr, uint32_t *mask, wbudget *wb)
{
    size_t words = ((size_t)tr->vocab_size + 31) / 32;
    memset(mask, 0, words * sizeof *mask);
    if (m->n_level < tr->max_len + 1) {
        kvp_gset *l = realloc(m->level, ((size_t)tr->max_len + 1) * sizeof *l);
        if (!l)
            return -ENOMEM;
        m->level = l;
        m->n_level = tr->max_len + 1;
    }
    const kvp_grammar *g = m->g;
    int mark_frames = m->n_frames, found = 0, cut = 0, rc = 0;
    long work0 = m->work;
    m->limit = work0 + kvp_grammar_mask_budget(tr);
    m->level[0] = m->cur;
    /* the first bytes some thread has an arc for: no other one can start a token */
    uint32_t first[8] = {0};
    for (int i = 0; i < m->cur.n; i++) {
        int32_t s = m->cur.t[i].state;
        m->work += g->arc_off[s + 1] - g->arc_off[s];
        for (int32_t a = g->arc_off[s]; a < g->arc_off[s + 1]; a++)
            if (g->arcs[a].kind == ARC_RANGE)
                for (unsigned b = g->arcs[a].lo; b <= g->arcs[a].hi; b++)
                    first[b >> 5] |= 1u << (b & 31);
    }
#define FIRST(b) ((first[(b) >> 5] >> ((b) & 31)) & 1)
    /* First the one-byte tokens (the root's children). */
    for (int i = 0; i < tr->n_nodes; i = tr->skip[i]) {
        if (!FIRST(tr->byte[i]))
            continue;
        if (m->work >= m->limit) {
            cut = 1;
            break;
        }
        if (step(m, &m->level[0], tr->byte[i], &m->level[1]) < 0) {
            rc = -ENOMEM;
            goto out;
        }
        if (m->level[1].n || m->level[1].complete)
            found += take(m, tr, i, &m->level[1], mask, wb, 0);
    }
    m->n_frames = mark_frames;
    /* Cut before any token was found: one more step, past the limit (within STEP_WORK),
     * for the first byte that may come next and is a token. */
    for (int i = 0; cut && !found && i < tr->n_nodes; i = tr->skip[i]) {
        if (!FIRST(tr->byte[i]) || tr->off[i + 1] == tr->off[i])
            continue;
        m->limit = LONG_MAX;
        if (step(m, &m->level[0], tr->byte[i], &m->level[1]) < 0) {
            rc = -ENOMEM;
            goto out;
        }
        if (m->level[1].n || m->level[1].complete)
            found += take(m, tr, i, &m->level[1], mask, wb, 0);
        break;
    }
    m->n_frames = mark_frames;
    /* Then the whole trie, each subtree left at the first byte the grammar refuses. */
    for (int i = 0; i < tr->n_nodes && !cut;) {
        int d = tr->depth[i];
        if (d == 1 && !FIRST(tr->byte[i])) {
            i = tr->skip[i];
            continue;
        }
        if (m->work >= m->limit) {
            cut = 1;
            break;
        }
        kvp_gset *out = &m->level[d];
        if (walk_step(m, &m->level[d - 1], tr->byte[i], out) < 0) {
            rc = -ENOMEM;
            goto out;
        }
        if (out->n == 0 && !out->complete) {
            i = tr->skip[i];
            continue;
        }
        take(m, tr, i, out, mask, wb, 1);
        i = out->n ? i + 1 : tr->skip[i];
    }
    m->n_frames = mark_frames;
    if (wb->left >= 0 && !wb->marked && !m->cur.complete) {
        int best = -1;
        int32_t bestd = KVP_GRAMMAR_FAR;
        m->limit = LONG_MAX;
        for (int i = 0; i < tr->n_nodes; i = tr->skip[i]) {
            if (!FIRST(tr->byte[i]) || tr->off[i + 1] == tr->off[i])
                continue;
            if (step(m, &m->level[0], tr->byte[i], &m->level[1]) < 0) {
                rc = -ENOMEM;
                goto out;
            }
            int32_t dd = m->level[1].n || m->level[1].complete ? set_dist(m, &m->level[1])
                                                                : KVP_GRAMMAR_FAR;
            m->n_frames = mark_frames;
            if (dd < bestd) {
                bestd = dd;
                best = i;
            }
            if (dd <= wb->left - 1)
                break;
        }
        if (best >= 0)
            mark(tr, best, mask);
    }
#undef FIRST
    if (cut) {
        m->cut_walks++;
        wb->full = 1;   /* the farther tokens were not all seen */
    }
    if (m->cur.complete)
        for (int k = 0; k < tr->n_end; k++) {
            int id = tr->end_tok[k];
            if (id >= 0 && id < tr->vocab_size)
                mask[id >> 5] |= 1u << (id & 31);
        }
    for (size_t w = 0; w < words; w++)
        rc += __builtin_popcount(mask[w]);
out:
    m->n_frames = mark_frames;   /* the walk's frames are garbage now */
    m->limit = LONG_MAX;
    m->mask_work = m->work - work0;
    return rc;
}

int kvp_gmatch_mask(kvp_gmatch *m, const kvp_vocab_trie *tr, uint32_t *mask)
{
    wbudget wb = {.left = -1, .base = KVP_GRAMMAR_FAR};
    m->shaped = 0;
    return walk(m, tr, mask, &wb);
}

/* ---- the length budget ---- */

/* A state of a run: no end and one arc, either of one byte (1: the bytes of a literal,
 * a key, the frame of a call, a const) or an epsilon or a call of a rule that may be
 * empty (2: the optional whitespace between a JSON document's tokens, which a run takes
 * empty). */
static int forced(const kvp_grammar *g, int s)
{
    const garc *a = &g->arcs[g->arc_off[s]];
    if ((g->flags[s] & ST_END) || g->arc_off[s + 1] - g->arc_off[s] != 1)
        return 0;
    if (a->kind == ARC_RANGE && a->lo == a->hi)
        return 1;
    return a->kind == ARC_EPS || (a->kind == ARC_CALL && g->dist[a->call] == 0) ? 2 : 0;
}

/* The child of trie node i (-1: the root, through top: its children by byte) with byte
 * b, or -1. */
static int trie_child(const kvp_vocab_trie *tr, const int32_t *top, int i, uint8_t b)
{
    if (i < 0)
        return top[b];
    int c = i + 1, end = tr->skip[i];
    for (; c < end; c = tr->skip[c])
        if (tr->byte[c] == b)
            return c;
    return -1;
}

/* For every forced state, the run of forced states from it to the first other one (its
 * end) and the fewest tokens of tr that spell the run's bytes exactly (each token within
 * the run, empty calls taken empty; KVP_GRAMMAR_FAR when none do): computed from each
 * run's end back, a state's cost the least of 1 + the cost after each token that spells
 * a prefix of its run. A
 * distance counting a run at that cost is still one the matcher can follow token by
 * token, and a long key or a call's frame counts as the few tokens it takes. */
static int run_costs(const kvp_grammar *g, const kvp_vocab_trie *tr, runs *r)
{
    int n = g->n_states;
    r->cost = malloc((size_t)n * sizeof *r->cost);
    r->end = malloc((size_t)n * sizeof *r->end);
    int32_t *list = malloc((size_t)n * sizeof *list);
    uint8_t *is = malloc((size_t)n);
    if (!r->cost || !r->end || !list || !is) {
        free(list);
        free(is);
        return -ENOMEM;
    }
    for (int s = 0; s < n; s++) {
        is[s] = (uint8_t)forced(g, s);
        r->cost[s] = -1;
        r->end[s] = s;
    }
    int32_t top[256];
    for (int b = 0; b < 256; b++)
        top[b] = -1;
    for (int i = 0; i < tr->n_nodes; i = tr->skip[i])
        top[tr->byte[i]] = i;
#define NEXT(s) (g->arcs[g->arc_off[s]].to)
#define BYTE(s) (g->arcs[g->arc_off[s]].lo)
    for (int s0 = 0; s0 < n; s0++) {
        if (!is[s0] || r->cost[s0] >= 0)
            continue;
        int len = 0, u = s0;
        /* forced states never form a cycle (it could not end: prune dropped it), so the
         * walk stops; the bound is a backstop */
        while (is[u] && r->cost[u] < 0 && len < n) {
            list[len++] = u;
            r->cost[u] = KVP_GRAMMAR_FAR;   /* on the list */
            u = NEXT(u);
        }
        int32_t end = is[u] ? r->end[u] : u;
        for (int k = len - 1; k >= 0; k--) {
            int32_t s = list[k], best = KVP_GRAMMAR_FAR, v = s;
            int node = -1;
            while (is[v] == 2)   /* a run starting with an empty call: the cost after it */
                v = NEXT(v);
            if (v != s) {
                r->cost[s] = is[v] ? r->cost[v] : 0;
                r->end[s] = end;
                continue;
            }
            while (is[v]) {
                if (is[v] == 2) {
                    v = NEXT(v);
                    continue;
                }
                node = trie_child(tr, top, node, BYTE(v));
                if (node < 0)
                    break;
                v = NEXT(v);
                if (tr->off[node + 1] > tr->off[node]) {
                    int32_t rest = is[v] ? r->cost[v] : 0;
                    int32_t c = dist_add(rest, 1);
                    best = c < best ? c : best;
                }
            }
            r->cost[s] = best;
            r->end[s] = end;
        }
    }
#undef NEXT
#undef BYTE
    free(list);
    free(is);
    return 0;
}

int kvp_gmatch_bind(kvp_gmatch *m, const kvp_vocab_trie *tr)
{
    if (m->own_dist)
        return 0;
    runs r = {NULL, NULL};
    int all = 1;
    for (int w = 0; w < 8; w++)
        all &= tr->lone[w] == 0xFFFFFFFFu;
    int32_t *d = run_costs(m->g, tr, &r) < 0 ? NULL : distances(m->g, all ? NULL : tr->lone, &r);
    free(r.cost);
    free(r.end);
    if (!d)
        return -ENOMEM;
    m->own_dist = d;
    m->dist = d;
    /* the frames made so far hold the grammar's distances: made again with these */
    for (int f = 0; f < m->n_frames; f++)
        m->fdist[f] = dist_add(d[m->ret[f]], m->parent[f] < 0 ? 0 : m->fdist[m->parent[f]]);
    cache_clear(m);
    return 0;
}

/* The mask cache: CACHE_N masks of what the grammar allows, each with its thread set,
 * the largest distance after a token it offers, and (n_far >= 0) the tokens leading
 * farther than the set's own distance base with their distances. It is given again for
 * the same set while the largest distance fits in the tokens left; nearer the limit,
 * while base does, less the far tokens that do not fit. */
#define CACHE_N 4
#define CACHE_FAR 8192
typedef struct centry {
    kvp_gset key;
    int valid, count;
    int32_t maxd, base;
    int n_far;
    int32_t (*far)[2];    /* [CACHE_FAR] */
    unsigned long used;
} centry;

typedef struct gcache {
    size_t words;
    unsigned long clock;
    int32_t (*far)[2];    /* [CACHE_FAR] the walk's far tokens */
    centry e[CACHE_N];
    uint32_t bits[];      /* CACHE_N masks of words words */
} gcache;

static void cache_clear(kvp_gmatch *m)
{
    gcache *c = m->cache;
    if (c)
        for (int k = 0; k < CACHE_N; k++)
            c->e[k].valid = 0;
}

static void cache_free(kvp_gmatch *m)
{
    gcache *c = m->cache;
    if (c) {
        for (int k = 0; k < CACHE_N; k++)
            free(c->e[k].far);
        free(c->far);
    }
    free(c);
    m->cache = NULL;
}

static int same_set(const kvp_gset *a, const kvp_gset *b)
{
    return a->n == b->n && a->complete == b->complete &&
           !memcmp(a->t, b->t, (size_t)a->n * sizeof a->t[0]);
}

int kvp_gmatch_mask_left(kvp_gmatch *m, const kvp_vocab_trie *tr, uint32_t *mask, int left)
{
    size_t words = ((size_t)tr->vocab_size + 31) / 32;
    gcache *c = m->cache;
    if (c && c->words != words) {
        cache_free(m);
        c = NULL;
    }
    if (!c && (c = m->cache = calloc(1, sizeof *c + CACHE_N * words * sizeof(uint32_t)))) {
        c->words = words;
        c->far = malloc(CACHE_FAR * sizeof *c->far);
    }
    m->shaped = 0;
    for (int k = 0; c && k < CACHE_N; k++) {
        centry *e = &c->e[k];
        if (!e->valid || !same_set(&e->key, &m->cur))
            continue;
        int whole = left < 0 || e->maxd <= left - 1;
        if (!whole && (e->n_far < 0 || e->base > left - 1))
            break;   /* too near the limit for this entry: walked */
        memcpy(mask, c->bits + (size_t)k * words, words * sizeof *mask);
        int count = e->count;
        for (int j = 0; !whole && j < e->n_far; j++)
            if (e->far[j][1] > left - 1) {
                int32_t t = e->far[j][0];
                mask[t >> 5] &= ~(1u << (t & 31));
                count--;
                m->shaped = 1;
            }
        e->used = ++c->clock;
        m->cache_hits++;
        m->mask_work = 0;
        return count;
    }
    int32_t (*far)[2] = c ? c->far : NULL;
    wbudget wb = {.left = left, .base = kvp_gmatch_distance(m), .far = far,
                  .cap_far = far ? CACHE_FAR : 0};
    int rc = walk(m, tr, mask, &wb);
    /* kept when it is (or, from its far tokens, can be made) the grammar's whole mask */
    int keep = rc > 0 && c && (!m->shaped || (!wb.full && left - 1 >= wb.base));
    if (keep) {
        int k = 0;   /* a free entry, else the least recently used */
        for (int j = 1; j < CACHE_N && c->e[k].valid; j++)
            if (!c->e[j].valid || c->e[j].used < c->e[k].used)
                k = j;
        centry *e = &c->e[k];
        if (!e->far)
            e->far = malloc(CACHE_FAR * sizeof *e->far);
        uint32_t *bits = c->bits + (size_t)k * words;
        memcpy(bits, mask, words * sizeof *mask);
        int count = rc;
        for (int j = 0; j < wb.n_far; j++) {
            int32_t t = far[j][0];
            if (!((bits[t >> 5] >> (t & 31)) & 1)) {
                bits[t >> 5] |= 1u << (t & 31);
                count++;
            }
        }
        e->key = m->cur;
        e->valid = 1;
        e->count = count;
        e->maxd = wb.maxd;
        e->base = wb.base;
        e->n_far = e->far && !wb.full ? wb.n_far : -1;
        if (e->far && e->n_far > 0)
            memcpy(e->far, far, (size_t)wb.n_far * sizeof *far);
        e->used = ++c->clock;
    }
    return rc;
}

void kvp_grammar_apply_mask(float *logits, const uint32_t *mask, int vocab_size)
{
    for (int w = 0; w * 32 < vocab_size; w++) {
        uint32_t bits = mask[w];
        if (bits == 0xFFFFFFFFu)
            continue;
        int end = w * 32 + 32 < vocab_size ? w * 32 + 32 : vocab_size;
        for (int i = w * 32; i < end; i++)
            if (!(bits & (1u << (i - w * 32))))
                logits[i] = -__builtin_inff();
    }
}
