/* Decode speed under eviction, per policy and budget, against the full cache ("none"),
 * plus the cost of KVP's scoring and of eviction as a share of decode time, and the
 * cache bytes a session holds at each budget.
 *
 * usage: bench_policies [MODEL [TOKENIZER]] [--kvp FILE] [--prefill N] [--decode N]
 *                       [--policies LIST]
 * Without --kvp, a randomly initialised KVP file (default widths) is used: scoring cost
 * does not depend on training. When prefill + decode pass the context, the bounded
 * policies run through context shifts (KVP rescoring the rows a shift moved) and "none",
 * which cannot shift, decodes only the tokens that fit. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "generate/generate.h"
#include "policy/kvp_agent.h"
#include "offline/agent_train.h"
#include "base/parse.h"
#include "base/clock.h"

/* Timing shim around a policy's on_insert: the scoring cost of score-on-insert policies. */
static const kvp_policy_ops *inner_ops;
static double insert_s;

static void timed_insert(kvp_policy *p, int layer, int kvh, kvp_head *h, int first, int n)
{
    double t0 = kvp_now();
    inner_ops->on_insert(p, layer, kvh, h, first, n);
    insert_s += kvp_now() - t0;
}

typedef struct {
    double tok_s, insert_share, evict_share;
    size_t bytes;
    int max_rows;
} result;

static int run(const kvp_model *m, const char *policy_name, const char *kvp_file, int budget,
               const int *prompt, int n_prefill, int n_decode, result *out)
{
    char err[512];
    kvp_policy *p;
    if (kvp_policy_create(&p, policy_name, kvp_file, &m->cfg, 1, err, sizeof err)) {
        fprintf(stderr, "bench_policies: %s\n", err);
        return -1;
    }
    kvp_policy_ops shim = *p->ops;
    inner_ops = p->ops;
    if (shim.on_insert)
        shim.on_insert = timed_insert;
    p->ops = &shim;
    kvp_runstate s;
    kvp_cache c;
    kvp_runstate_init(&s, &m->cfg, 64);
    kvp_cache_init(&c, m->cfg.n_layers, m->cfg.n_kv_heads, m->cfg.head_dim, &m->cfg.rope);
    kvp_evict_cfg e = {.policy = p, .budget = budget, .chunk = 32};
    int rc = kvp_gen_prefill(m, &s, &c, &e, prompt, n_prefill, NULL);
    insert_s = 0.0;
    double evict_s = 0.0, t0 = kvp_now();
    int tok = prompt[n_prefill];
    for (int i = 0; i < n_decode && !rc; i++) {
        /* the trigger kvp_gen_decode would run, done here so it can be timed apart */
        if (budget > 0 && kvp_cache_max_rows(&c) + 1 > budget + e.chunk) {
            double t1 = kvp_now();
            kvp_policy_evict(p, &c, budget);
            evict_s += kvp_now() - t1;
        }
        rc = kvp_gen_decode(m, &s, &c, &e, tok);
        tok = prompt[n_prefill + 1 + i];
    }
    double total = kvp_now() - t0;
    if (rc)
        fprintf(stderr, "bench_policies: %s budget %d failed (%d)\n", policy_name, budget, rc);
    out->tok_s = n_decode / total;
    out->insert_share = insert_s / total;
    out->evict_share = evict_s / total;
    out->bytes = kvp_cache_bytes(&c);
    out->max_rows = kvp_cache_max_rows(&c);
    p->ops = inner_ops;
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    kvp_policy_destroy(p);
    return rc ? -1 : 0;
}

int main(int argc, char **argv)
{
    const char *model_path = "models/stories260K.bin", *tok_path = NULL, *kvp_file = NULL;
    const char *list = "random,streaming,knorm,keydiff,lagkv,h2o,tova,snapkv,expected_attention,kvp";
    int n_prefill = 128, n_decode = 352, pos = 0;
    long v;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--kvp") && i + 1 < argc)
            kvp_file = argv[++i];
        else if (!strcmp(argv[i], "--prefill") && i + 1 < argc && kvp_parse_long(argv[i + 1], 1, 1 << 20, &v))
            n_prefill = (int)v, i++;
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc && kvp_parse_long(argv[i + 1], 1, 1 << 20, &v))
            n_decode = (int)v, i++;
        else if (!strcmp(argv[i], "--policies") && i + 1 < argc)
            list = argv[++i];
        else if (pos == 0 && argv[i][0] != '-')
            model_path = argv[i], pos++;
        else if (pos == 1 && argv[i][0] != '-')
            tok_path = argv[i], pos++;
        else {
            fprintf(stderr, "usage: bench_policies [MODEL [TOKENIZER]] [--kvp FILE] "
                    "[--prefill N] [--decode N] [--policies LIST]\n");
            return 2;
        }
    }
    char err[512];
    kvp_model m;
    if (kvp_model_load(&m, model_path, tok_path, err, sizeof err)) {
        fprintf(stderr, "bench_policies: %s\n", err);
        return 1;
    }
    if (n_prefill < 1 || n_decode < 1 || n_prefill + 2 > m.cfg.seq_len) {
        fprintf(stderr, "bench_policies: the prefill and one decoded token must fit the "
                "context (%d)\n", m.cfg.seq_len);
        return 2;
    }
    int n_decode_full = n_prefill + n_decode + 1 > m.cfg.seq_len ? m.cfg.seq_len - n_prefill - 1
                                                                  : n_decode;
    /* --policies: names of kvp_policy_names() but "none" (the reference row) */
    char names[16][32];
    int n_names = 0;
    for (const char *q = list; *q; q += strcspn(q, ",") + (q[strcspn(q, ",")] == ',')) {
        int len = (int)strcspn(q, ",");
        const char *all = kvp_policy_names();
        int known = 0;
        for (const char *w = all; *w; w += strcspn(w, " ") + (w[strcspn(w, " ")] == ' '))
            known |= (int)strcspn(w, " ") == len && !strncmp(w, q, (size_t)len);
        if (n_names == 16 || !known || (len == 4 && !strncmp(q, "none", 4))) {
            fprintf(stderr, "bench_policies: bad --policies entry '%.*s' (one of: %s; not none; "
                    "at most 16)\n", len, q, all);
            return 2;
        }
        memcpy(names[n_names], q, (size_t)len);   /* a known name: shorter than a slot */
        names[n_names++][len] = 0;
    }
    char tmp_policy[64] = "";
    if (!kvp_file) {
        kvp_agent_set set;
        kvp_agent_arch a = {m.cfg.head_dim, KVP_AGENT_DEFAULT_P, KVP_AGENT_DEFAULT_E,
                            KVP_AGENT_DEFAULT_H, KVP_AGENT_DEFAULT_PMAX, 1, 1};
        snprintf(tmp_policy, sizeof tmp_policy, "/tmp/bench-policies-%d.kvp", (int)getpid());
        if (kvp_agent_set_alloc(&set, m.cfg.n_layers, m.cfg.n_kv_heads, &a, err, sizeof err) ||
            kvp_agent_set_rope(&set, &m.cfg.rope, err, sizeof err)) {
            fprintf(stderr, "bench_policies: %s\n", err);
            return 1;
        }
        kvp_agent_set_init(&set, 1);
        if (kvp_agent_set_save(&set, tmp_policy, err, sizeof err)) {
            fprintf(stderr, "bench_policies: %s\n", err);
            return 1;
        }
        kvp_agent_set_free(&set);
        kvp_file = tmp_policy;
    }
    /* a fixed pseudo-text: token ids cycling through the vocabulary */
    int n_tok = n_prefill + n_decode + 1;
    int *prompt = malloc((size_t)n_tok * sizeof *prompt);
    prompt[0] = m.tok.bos_id;
    for (int i = 1; i < n_tok; i++)
        prompt[i] = 3 + (int)((i * 2654435761u) % (unsigned)(m.cfg.vocab_size - 3));

    printf("model %s: %d layers x %d KV heads x head_dim %d, context %d; prefill %d, decode %d "
           "tokens (none: %d); kvp file %s\n\n", m.name, m.cfg.n_layers, m.cfg.n_kv_heads,
           m.cfg.head_dim, m.cfg.seq_len, n_prefill, n_decode, n_decode_full, kvp_file);
    result full;
    if (run(&m, "none", NULL, 0, prompt, n_prefill, n_decode_full, &full))
        return 1;
    /* scoring + eviction: the bound for KVP is 5% of decode time */
    printf("| policy | budget | decode tok/s | vs none | scoring %% | eviction %% | scoring + eviction %% "
           "| rows/head (max) | cache bytes |\n");
    printf("|---|---|---|---|---|---|---|---|---|\n");
    printf("| none | - | %.0f | 1.00 | - | - | - | %d | %zu |\n", full.tok_s, full.max_rows,
           full.bytes);
    int budgets[] = {64, 128};
    for (size_t b = 0; b < 2; b++)
        for (int i = 0; i < n_names; i++) {
            result r;
            if (run(&m, names[i], kvp_file, budgets[b], prompt, n_prefill, n_decode, &r))
                return 1;
            printf("| %s | %d | %.0f | %.2f | %.1f | %.1f | %.1f | %d | %zu |\n", names[i],
                   budgets[b], r.tok_s, r.tok_s / full.tok_s, 100 * r.insert_share,
                   100 * r.evict_share, 100 * (r.insert_share + r.evict_share), r.max_rows,
                   r.bytes);
        }
    if (tmp_policy[0])
        remove(tmp_policy);
    free(prompt);
    kvp_model_free(&m);
    return 0;
}
