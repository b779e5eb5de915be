/* The tokenizers' shared merge loop (see merges.h). */
#include "model/merges.h"

static int before(const kvp_merge *a, const kvp_merge *b)
{
    return a->priority > b->priority || (a->priority == b->priority && a->left < b->left);
}

void kvp_merges_push(kvp_merges *m, kvp_merge c)
{
    int i = m->nheap++;
    while (i > 0 && before(&c, &m->heap[(i - 1) / 2])) {
        m->heap[i] = m->heap[(i - 1) / 2];
        i = (i - 1) / 2;
    }
    m->heap[i] = c;
}

static kvp_merge pop(kvp_merges *m)
{
    kvp_merge top = m->heap[0], last = m->heap[--m->nheap];
    int i = 0;
    for (;;) {
        int c = 2 * i + 1;
        if (c >= m->nheap)
            break;
        if (c + 1 < m->nheap && before(&m->heap[c + 1], &m->heap[c]))
            c++;
        if (!before(&m->heap[c], &last))
            break;
        m->heap[i] = m->heap[c];
        i = c;
    }
    m->heap[i] = last;
    return top;
}

void kvp_merges_run(kvp_merges *m, int n, void (*pair)(void *ctx, int left), void *ctx)
{
    for (int i = 0; i < n; i++) {
        m->syms[i].prev = i - 1;
        m->syms[i].next = i + 1 < n ? i + 1 : -1;
    }
    m->nheap = 0;
    for (int i = 0; i + 1 < n; i++)
        pair(ctx, i);
    while (m->nheap > 0) {
        kvp_merge c = pop(m);
        kvp_sym *l = &m->syms[c.left], *r = &m->syms[c.right];
        /* Stale: an earlier merge changed a side. Still adjacent with the same tokens
         * means the same merge. */
        if (l->tok != c.ltok || l->next != c.right || r->tok != c.rtok)
            continue;
        l->tok = c.id;
        l->next = r->next;
        if (r->next >= 0)
            m->syms[r->next].prev = c.left;
        r->tok = -1;
        pair(ctx, l->prev);
        pair(ctx, c.left);
    }
}
