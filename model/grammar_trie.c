/* The vocabulary's byte strings as a preorder trie (model/grammar.h): the tokens are
 * sorted by their bytes, so walking them in order opens each node once, right after its
 * parent, and closes it (its skip) when the next token leaves its subtree. */
#include "model/grammar.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

typedef struct tentry {
    const char *p;
    int len, id;
} tentry;

static int cmp_entry(const void *a, const void *b)
{
    const tentry *x = a, *y = b;
    int n = x->len < y->len ? x->len : y->len;
    int c = memcmp(x->p, y->p, (size_t)n);
    if (c)
        return c;
    if (x->len != y->len)
        return x->len < y->len ? -1 : 1;
    return x->id < y->id ? -1 : x->id > y->id;
}

/* Tokens that text may hold: the encoder's text tokens and the byte tokens. */
static int text_token(const kvp_tokenizer *t, int id, const char **p, int *len)
{
    size_t n = 0;
    const char *s = kvp_tokenizer_piece(t, -1, id, &n);
    if (!s || n == 0 || n > 0xFFFF)
        return 0;
    *p = s;
    *len = (int)n;
    return 1;
}

int kvp_vocab_trie_build(kvp_vocab_trie *tr, const kvp_tokenizer *t)
{
    memset(tr, 0, sizeof *tr);
    tr->vocab_size = t->vocab_size;
    tentry *e = malloc((size_t)t->vocab_size * sizeof *e);
    char *keep = calloc((size_t)t->vocab_size, 1);
    if (!e || !keep) {
        free(e);
        free(keep);
        return -ENOMEM;
    }
    for (int i = 0; i < t->n_text; i++)
        keep[t->sorted[i]] = 1;
    for (int b = 0; b < 256; b++)
        if (t->byte_token[b] >= 0)
            keep[t->byte_token[b]] = 1;
    int n = 0;
    for (int id = 0; id < t->vocab_size; id++)
        if (keep[id] && text_token(t, id, &e[n].p, &e[n].len)) {
            e[n].id = id;
            n++;
        }
    free(keep);
    qsort(e, (size_t)n, sizeof *e, cmp_entry);
    size_t cap = 1;   /* nodes: at most one per byte of the pieces */
    for (int i = 0; i < n; i++)
        cap += (size_t)e[i].len;
    tr->byte = malloc(cap);
    tr->depth = malloc(cap * sizeof *tr->depth);
    tr->skip = malloc(cap * sizeof *tr->skip);
    tr->off = malloc((cap + 1) * sizeof *tr->off);
    tr->tok = malloc(((size_t)n + 1) * sizeof *tr->tok);
    int max_len = 0;
    for (int i = 0; i < n; i++)
        max_len = e[i].len > max_len ? e[i].len : max_len;
    int32_t *path = malloc(((size_t)max_len + 1) * sizeof *path);
    if (!tr->byte || !tr->depth || !tr->skip || !tr->off || !tr->tok || !path) {
        free(e);
        free(path);
        kvp_vocab_trie_free(tr);
        return -ENOMEM;
    }
    /* path[d - 1]: the open node at depth d; plen: how many are open */
    int plen = 0, nn = 0, nt = 0;
    const char *prev = NULL;
    for (int i = 0; i < n; i++) {
        int l = 0;
        while (prev && l < plen && l < e[i].len && prev[l] == e[i].p[l])
            l++;
        while (plen > l)
            tr->skip[path[--plen]] = nn;
        for (int k = l; k < e[i].len; k++) {
            tr->byte[nn] = (uint8_t)e[i].p[k];
            tr->depth[nn] = (uint16_t)(k + 1);
            tr->off[nn] = nt;
            path[plen++] = nn++;
        }
        tr->tok[nt++] = e[i].id;   /* at the newest node, which spells e[i] */
        prev = e[i].p;
    }
    while (plen > 0)
        tr->skip[path[--plen]] = nn;
    tr->off[nn] = nt;
    tr->n_nodes = nn;
    tr->max_len = max_len;
    for (int i = 0; i < nn; i = tr->skip[i])
        if (tr->off[i + 1] > tr->off[i] && !((tr->lone[tr->byte[i] >> 5] >> (tr->byte[i] & 31)) & 1)) {
            tr->lone[tr->byte[i] >> 5] |= 1u << (tr->byte[i] & 31);
            tr->n_lone++;
        }
    free(path);
    free(e);
    return 0;
}

void kvp_vocab_trie_free(kvp_vocab_trie *tr)
{
    free(tr->byte);
    free(tr->depth);
    free(tr->skip);
    free(tr->off);
    free(tr->tok);
    memset(tr, 0, sizeof *tr);
}
