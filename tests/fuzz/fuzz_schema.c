/* A JSON schema from untrusted bytes (model/schema.h): compiled, and when accepted, a
 * few mask steps on a small vocabulary (every byte and some JSON-shaped pieces), each
 * taking a token the mask allowed. What the compiler and the matcher promise is checked:
 * a refusal has a message; the start is open or whole; a mask writes only its vocabulary,
 * stays within its work budget, offers a token whenever the document can go on, offers
 * the stop token only when it is whole; every allowed token is accepted; a finished
 * document is JSON. */
#include <stdlib.h>
#include <string.h>

#include "model/grammar.h"
#include "model/schema.h"
#include "tests/fuzz/fuzz.h"

#define N_PIECES (256 + 24)
#define END_TOK N_PIECES   /* the stop token: one past the pieces */

static const char *const extra[24] = {
    "{\"", "\":", "\": ", "\",", "\"}", "true", "false", "null", "  ", "\n  ", "12", "-1",
    "0.", "e+", "ab", "abc", "\\u00", "\\\"", "[]", "{}", "\xc3\xa9", "\xe2\x82\xac", "\"a",
    ", \""};

static char piece[N_PIECES][8];
static int piece_len[N_PIECES];
static kvp_vocab_trie trie;

static int cmp_piece(const void *a, const void *b)
{
    int x = *(const int *)a, y = *(const int *)b;
    int n = piece_len[x] < piece_len[y] ? piece_len[x] : piece_len[y];
    int c = memcmp(piece[x], piece[y], (size_t)n);
    return c ? c : piece_len[x] - piece_len[y];
}

/* The trie of the pieces, in preorder as model/grammar_trie.c lays it out. */
static void build_trie(void)
{
    for (int i = 0; i < 256; i++) {
        piece[i][0] = (char)i;
        piece_len[i] = 1;
    }
    for (int i = 0; i < 24; i++) {
        piece_len[256 + i] = (int)strlen(extra[i]);
        memcpy(piece[256 + i], extra[i], (size_t)piece_len[256 + i]);
    }
    static int order[N_PIECES];
    static uint8_t byte[N_PIECES * 8];
    static uint16_t depth[N_PIECES * 8];
    static int32_t skip[N_PIECES * 8], off[N_PIECES * 8 + 1], tok[N_PIECES];
    for (int i = 0; i < N_PIECES; i++)
        order[i] = i;
    qsort(order, N_PIECES, sizeof *order, cmp_piece);
    int path[8], plen = 0, nn = 0, nt = 0, max_len = 0;
    const char *prev = NULL;
    int prev_len = 0;
    for (int k = 0; k < N_PIECES; k++) {
        const char *p = piece[order[k]];
        int len = piece_len[order[k]], l = 0;
        while (prev && l < plen && l < len && l < prev_len && prev[l] == p[l])
            l++;
        while (plen > l)
            skip[path[--plen]] = nn;
        for (int j = l; j < len; j++) {
            byte[nn] = (uint8_t)p[j];
            depth[nn] = (uint16_t)(j + 1);
            off[nn] = nt;
            path[plen++] = nn++;
        }
        tok[nt++] = order[k];
        prev = p;
        prev_len = len;
        max_len = len > max_len ? len : max_len;
    }
    while (plen > 0)
        skip[path[--plen]] = nn;
    off[nn] = nt;
    trie = (kvp_vocab_trie){.vocab_size = N_PIECES + 1, .n_nodes = nn, .byte = byte,
                            .depth = depth, .skip = skip, .off = off, .tok = tok,
                            .max_len = max_len, .n_end = 1, .end_tok = {END_TOK}};
}

static int allowed(const uint32_t *mask, int id)
{
    return (mask[id >> 5] >> (id & 31)) & 1;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (!trie.n_nodes)
        build_trie();
    json_t *s = json_loadb((const char *)data, size, JSON_DECODE_ANY, NULL);
    if (!s)
        return 0;
    char err[320] = "";
    kvp_grammar *g = kvp_schema_compile(s, err, sizeof err);
    json_decref(s);
    if (!g) {
        if (!err[0])
            abort();
        return 0;
    }
    kvp_gmatch m;
    if (kvp_gmatch_init(&m, g) < 0) {
        kvp_grammar_unref(g);
        return 0;
    }
    if (kvp_gmatch_closed(&m) && !kvp_gmatch_complete(&m))
        abort();   /* a compiled grammar has a document */
    uint32_t mask[(N_PIECES + 1 + 31) / 32 + 1];
    char doc[256];
    size_t len = 0;
    uint32_t h = 2166136261u;   /* the choices: a hash of the input */
    for (size_t i = 0; i < size; i++)
        h = (h ^ data[i]) * 16777619u;
    long budget = kvp_grammar_mask_budget(&trie);
    for (int t = 0; t < 24; t++) {
        mask[sizeof mask / sizeof mask[0] - 1] = 0xA5A5A5A5u;   /* past the mask: kept */
        int n = kvp_gmatch_mask(&m, &trie, mask);
        if (n < 0)
            break;
        if (mask[sizeof mask / sizeof mask[0] - 1] != 0xA5A5A5A5u ||
            m.mask_work > budget + KVP_GRAMMAR_MASK_OVERRUN ||
            allowed(mask, END_TOK) != kvp_gmatch_complete(&m) ||
            (n == 0 && !kvp_gmatch_closed(&m)))
            abort();
        if (n == 0)
            break;
        h = h * 1103515245u + 12345u;
        int pick = (int)((h >> 8) % (uint32_t)n), id = -1;
        for (int i = 0; i <= N_PIECES && id < 0; i++)
            if (allowed(mask, i) && pick-- == 0)
                id = i;
        if (id < 0)
            abort();   /* fewer tokens than it counted */
        if (id == END_TOK)
            break;
        if (kvp_gmatch_accept(&m, piece[id], (size_t)piece_len[id]) != 0)
            abort();   /* an allowed token is accepted */
        if (len + (size_t)piece_len[id] < sizeof doc) {
            memcpy(doc + len, piece[id], (size_t)piece_len[id]);
            len += (size_t)piece_len[id];
        } else
            len = sizeof doc + 1;   /* too long to keep: not checked */
    }
    if (kvp_gmatch_complete(&m) && len <= sizeof doc) {
        json_t *v = json_loadb(doc, len, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (!v)
            abort();   /* a whole document is JSON */
        json_decref(v);
    }
    kvp_gmatch_free(&m);
    kvp_grammar_unref(g);
    return 0;
}
