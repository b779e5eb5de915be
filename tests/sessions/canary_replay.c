/* canary-replay: the eviction canary's measurement replayed offline on held-out lines,
 * with the exact KL beside the canary's estimate, for scripts/canary-vs-eval.sh.
 *   canary-replay MODEL TOKENIZER POLICY POLICY_FILE|- BUDGET TEXT LINES MAX_TOKENS
 * For each of the first LINES lines of TEXT with at least 20 words (cut to 600 bytes, as
 * the script sends them to kvpd), with f32 rows, chunk 32 and the policy fresh per line:
 *   own   BOS + the line, then a greedy reply of up to MAX_TOKENS tokens decoded under
 *         eviction (what kvpd at temperature 0 does), the evicted distributions kept;
 *   text  BOS + the line and the text that follows it, as many tokens as own had,
 *         teacher forced under eviction (what kvp eval's streaming protocol feeds).
 * At the reply positions of each (the ones the canary checks) the full cache's
 * distribution is compared with the evicted one twice: the exact KL over the vocabulary,
 * and the canary's estimate (kvp_canary_note + kvp_canary_kl_pos, the top-16 partition
 * bound). A reply stops at EOS or BOS (the plain template's stops) or MAX_TOKENS. Prints
 * one line: the four figures, each the mean over lines of a line's mean over its
 * positions (the canary's weighting: every turn counts once), and the positions. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cache/kvcache.h"
#include "generate/generate.h"
#include "model/model.h"
#include "offline/oracle.h"
#include "sessions/canary.h"

#define CHUNK 32

/* Sums over lines of each line's mean (so every line weighs the same, as every turn does
 * in the canary's mean), and the positions. */
typedef struct sums {
    double exact, bound;
    long lines, positions;
} sums;

static int fresh_cache(kvp_cache *c, const kvp_model *m)
{
    const kvp_model_config *cfg = &m->cfg;
    int rc = kvp_cache_init(c, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim, &cfg->rope);
    if (rc == 0 && (rc = kvp_cache_convert(c, KVP_KV_F32)) < 0)
        kvp_cache_free(c);
    return rc;
}

/* Positions from..n-2 of toks (row t of q_all: the evicted logits predicting toks[t + 1])
 * against one full-cache pass over toks. 0 or a negative code. */
static int compare(const kvp_model *m, kvp_runstate *s, const int *toks, int n, int from,
                   float *q_all, float *p_all, sums *out)
{
    int V = m->cfg.vocab_size, rc;
    double exact = 0.0, bound = 0.0;
    long n_pos = 0;
    kvp_cache c;
    if ((rc = fresh_cache(&c, m)))
        return rc;
    kvp_policy_attach(&s->hooks, NULL);
    for (int at = 0; at < n && rc == 0; at += CHUNK) {
        int len = n - at < CHUNK ? n - at : CHUNK;
        rc = kvp_gen_prefill(m, s, &c, NULL, toks + at, len, p_all + (size_t)at * V);
    }
    kvp_cache_free(&c);
    for (int t = from; rc == 0 && t < n - 1; t++) {
        float *p = p_all + (size_t)t * V, *q = q_all + (size_t)t * V;
        kvp_canary_log_softmax(p, V);
        kvp_canary_rec *r = kvp_canary_rec_new("replay", 1);
        if (!r || kvp_canary_note(r, toks, t + 1, 0, q, V, toks[t + 1]) < 0) {
            kvp_canary_rec_free(r);
            return -1;
        }
        int agree;
        bound += kvp_canary_kl_pos(&r->pos[0], p, V, &agree);
        kvp_canary_rec_free(r);
        kvp_canary_log_softmax(q, V);
        double kl = 0.0;
        for (int i = 0; i < V; i++)
            kl += exp((double)p[i]) * ((double)p[i] - (double)q[i]);
        exact += kl;
        n_pos++;
    }
    if (rc == 0 && n_pos) {
        out->exact += exact / (double)n_pos;
        out->bound += bound / (double)n_pos;
        out->lines++;
        out->positions += n_pos;
    }
    return rc;
}

static int policy(kvp_policy **p, const kvp_model *m, const char *name, const char *file)
{
    char err[512];
    if (kvp_offline_policy_create(p, name, strcmp(file, "-") ? file : NULL, &m->cfg, 1, err,
                                  sizeof err)) {
        fprintf(stderr, "canary-replay: %s\n", err);
        return -1;
    }
    return 0;
}

int main(int argc, char **argv)
{
    if (argc != 9) {
        fprintf(stderr, "usage: canary-replay MODEL TOKENIZER POLICY POLICY_FILE|- BUDGET "
                "TEXT LINES MAX_TOKENS\n");
        return 2;
    }
    const char *pname = argv[3], *pfile = argv[4];
    int budget = atoi(argv[5]), lines = atoi(argv[7]), max_tokens = atoi(argv[8]);
    kvp_model m;
    char err[512];
    if (kvp_model_load(&m, argv[1], argv[2], err, sizeof err)) {
        fprintf(stderr, "canary-replay: %s\n", err);
        return 1;
    }
    int V = m.cfg.vocab_size, ctx = m.cfg.seq_len;
    FILE *f = fopen(argv[6], "rb");
    if (!f) {
        perror(argv[6]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    rewind(f);
    char *text = malloc((size_t)size + 1);
    if (!text || fread(text, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "canary-replay: cannot read %s\n", argv[6]);
        return 1;
    }
    fclose(f);
    text[size] = '\0';
    kvp_runstate s;
    float *q_all = malloc((size_t)ctx * V * sizeof *q_all);
    float *p_all = malloc((size_t)ctx * V * sizeof *p_all);
    /* the text after a line: at most 16 contexts' worth of bytes, a token per byte at most
     * (and the dummy prefix) */
    size_t follow_max = (size_t)ctx * 16;
    int *toks = malloc((size_t)ctx * sizeof *toks);
    int *follow = malloc((follow_max + 16) * sizeof *follow);
    if (kvp_runstate_init(&s, &m.cfg, ctx) || !q_all || !p_all || !toks || !follow) {
        fprintf(stderr, "canary-replay: out of memory\n");
        return 1;
    }
    sums own = {0}, txt = {0};
    int done = 0, rc = 0;
    for (char *line = text; *line && done < lines && rc == 0;) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line) : strlen(line);
        char *next = nl ? nl + 1 : line + len;
        size_t cut = len < 600 ? len : 600;
        int words = 0;
        for (size_t i = 0; i < cut; i++)
            words += line[i] == ' ' && (i == 0 || line[i - 1] != ' ');
        if (words + 1 < 20) {
            line = next;
            continue;
        }
        toks[0] = m.tok.bos_id;
        int np = kvp_tokenizer_encode(&m.tok, line, cut, 0, toks + 1, ctx / 2);
        if (np < 0) {
            line = next;
            continue;
        }
        np += 1;
        /* own: the greedy reply under eviction */
        kvp_policy *p;
        if (policy(&p, &m, pname, pfile))
            return 1;
        kvp_evict_cfg e = {p, budget, CHUNK, 0};
        kvp_cache c;
        if ((rc = fresh_cache(&c, &m)))
            break;
        kvp_policy_attach(&s.hooks, p);
        rc = kvp_gen_prefill(&m, &s, &c, &e, toks, np, q_all);
        int n = np;
        for (int k = 0; rc == 0 && k < max_tokens && n < ctx; k++) {
            memcpy(q_all + (size_t)(n - 1) * V, s.logits, (size_t)V * sizeof *q_all);
            int best = 0;
            for (int i = 1; i < V; i++)
                if (s.logits[i] > s.logits[best])
                    best = i;
            toks[n++] = best;
            /* the plain template's stops: EOS, and BOS (llama2.c stories end with it) */
            if (best == m.tok.eos_id || best == m.tok.bos_id || k == max_tokens - 1 ||
                n == ctx)
                break;
            rc = kvp_gen_decode(&m, &s, &c, &e, best);
        }
        kvp_policy_attach(&s.hooks, NULL);
        kvp_cache_free(&c);
        kvp_policy_destroy(p);
        if (rc || (rc = compare(&m, &s, toks, n, np - 1, q_all, p_all, &own)))
            break;
        /* text: the line and what follows it, as many tokens, teacher forced */
        size_t rest = (size_t)(text + size - line);
        if (rest > follow_max)
            rest = follow_max;
        int nt = kvp_tokenizer_encode(&m.tok, line, rest, 0, follow, (int)follow_max + 16);
        if (nt >= n - 1) {
            toks[0] = m.tok.bos_id;
            memcpy(toks + 1, follow, (size_t)(n - 1) * sizeof *toks);
            if (policy(&p, &m, pname, pfile))
                return 1;
            e.policy = p;
            if ((rc = fresh_cache(&c, &m)))
                break;
            kvp_policy_attach(&s.hooks, p);
            rc = kvp_gen_prefill(&m, &s, &c, &e, toks, n, q_all);
            kvp_policy_attach(&s.hooks, NULL);
            kvp_cache_free(&c);
            kvp_policy_destroy(p);
            if (rc || (rc = compare(&m, &s, toks, n, np - 1, q_all, p_all, &txt)))
                break;
        }
        done++;
        line = next;
    }
    if (rc || !own.lines || !txt.lines) {
        fprintf(stderr, "canary-replay: failed (%d) after %d lines\n", rc, done);
        return 1;
    }
    printf("lines %d own_exact %.5f own_canary %.5f own_positions %ld text_exact %.5f "
           "text_canary %.5f text_positions %ld\n", done, own.exact / own.lines,
           own.bound / own.lines, own.positions, txt.exact / txt.lines, txt.bound / txt.lines,
           txt.positions);
    free(text);
    free(q_all);
    free(p_all);
    free(toks);
    free(follow);
    kvp_runstate_free(&s);
    kvp_model_free(&m);
    return 0;
}
