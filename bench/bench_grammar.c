/* The cost of constrained decoding per token: one step's mask (the trie walk of
 * kvp_gmatch_mask, the logits set to -inf, the chosen token's bytes accepted) on the
 * vocabulary of MODEL (a GGUF; Qwen's 151,936 tokens in scripts/bench.sh --grammar),
 * against a decode step of MODEL (one token through kvp_forward) and the plain sampler
 * (kvp_sample over the same logits), measured in the same run in alternating blocks.
 * Documents are drawn from the grammar with random logits, so the mask is measured over
 * every kind of state (structure, strings, numbers, whitespace), document after document.
 * Prints medians (and the 90th percentile) in microseconds, the ratios, and the load.
 * --max-tokens N: with the length budget on (kvp_gmatch_mask_left, as a session runs
 * it): every document is a reply of at most N tokens, each mask offering only tokens
 * after which it can still be finished; also prints how many masks the cache gave and
 * how many the budget shaped. --any-object: response_format json_object's grammar (any
 * JSON object: long free strings) instead of the schema.
 *
 *   bench_grammar MODEL.gguf [--reps N] [--decode N] [--schema FILE | --any-object]
 *                 [--max-tokens N]
 *   (scripts/bench.sh --grammar; --schema: another schema than the built-in one) */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/model.h"
#include "model/sampler.h"
#include "model/schema.h"

static const char *schema_text =
    "{\"type\":\"object\",\"properties\":{"
    "\"name\":{\"type\":\"string\",\"maxLength\":40},"
    "\"age\":{\"type\":\"integer\",\"minimum\":0,\"maximum\":120},"
    "\"mood\":{\"enum\":[\"happy\",\"sad\",\"calm\"]},"
    "\"tags\":{\"type\":\"array\",\"items\":{\"type\":\"string\",\"maxLength\":12},\"maxItems\":4},"
    "\"home\":{\"type\":\"object\",\"properties\":{\"city\":{\"type\":\"string\",\"maxLength\":20},"
    "\"zip\":{\"type\":\"integer\",\"minimum\":10000,\"maximum\":99999},"
    "\"score\":{\"type\":\"number\",\"minimum\":0,\"maximum\":1}},"
    "\"required\":[\"city\",\"zip\"]},\"ok\":{\"type\":\"boolean\"}},"
    "\"required\":[\"name\",\"age\",\"mood\",\"home\",\"ok\"]}";

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static double pct(double *v, int n, double p)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n ? v[(int)(p * (n - 1))] : 0;
}

static void random_logits(float *l, int n, uint64_t *rng)
{
    for (int i = 0; i < n; i++)
        l[i] = 4.0f * kvp_rand_f32(rng);
}

int main(int argc, char **argv)
{
    const char *path = NULL, *schema_file = NULL;
    int reps = 8, decode_n = 16, mask_n = 64, max_tokens = -1, any_object = 0;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--decode") && i + 1 < argc)
            decode_n = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--schema") && i + 1 < argc)
            schema_file = argv[++i];
        else if (!strcmp(argv[i], "--max-tokens") && i + 1 < argc)
            max_tokens = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--any-object"))
            any_object = 1;
        else if (argv[i][0] != '-')
            path = argv[i];
        else {
            fprintf(stderr, "usage: bench_grammar MODEL.gguf [--reps N] [--decode N] "
                    "[--schema FILE | --any-object] [--max-tokens N]\n");
            return 2;
        }
    }
    if (!path || reps < 1 || decode_n < 1 || max_tokens == 0 || max_tokens < -1) {
        fprintf(stderr, "usage: bench_grammar MODEL.gguf [--reps N] [--decode N]\n");
        return 2;
    }
    kvp_model m;
    char err[512];
    if (kvp_model_load(&m, path, NULL, err, sizeof err) < 0) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    kvp_model_use_cores(&m);
    int vocab = m.cfg.vocab_size;
    double t0 = kvp_now();
    kvp_vocab_trie tr;
    if (kvp_vocab_trie_build(&tr, &m.tok) < 0) {
        fprintf(stderr, "bench_grammar: out of memory\n");
        return 1;
    }
    double build_ms = (kvp_now() - t0) * 1e3;
    if (tr.vocab_size < vocab)
        tr.vocab_size = vocab;
    tr.n_end = 1;
    tr.end_tok[0] = m.tok.eos_id >= 0 ? m.tok.eos_id : 0;
    json_error_t je;
    json_t *sj = schema_file ? json_load_file(schema_file, 0, &je) : json_loads(schema_text, 0, &je);
    if (!sj) {
        fprintf(stderr, "bench_grammar: %s: %s\n", schema_file ? schema_file : "schema", je.text);
        return 1;
    }
    t0 = kvp_now();
    kvp_grammar *g = any_object ? kvp_schema_any_object(err, sizeof err)
                                : kvp_schema_compile(sj, err, sizeof err);
    double compile_ms = (kvp_now() - t0) * 1e3;
    json_decref(sj);
    if (!g) {
        fprintf(stderr, "bench_grammar: %s\n", err);
        return 1;
    }
    printf("vocabulary %d tokens, trie %d nodes (built in %.1f ms); schema grammar %d states "
           "(compiled in %.2f ms)\n", m.tok.vocab_size, tr.n_nodes, build_ms,
           kvp_grammar_states(g), compile_ms);

    kvp_runstate rs;
    kvp_cache c;
    if (kvp_runstate_init(&rs, &m.cfg, 1) ||
        kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim, &m.cfg.rope)) {
        fprintf(stderr, "bench_grammar: out of memory\n");
        return 1;
    }
    kvp_sampler smp;
    kvp_sampler_init(&smp, vocab, 1.0f, 1.0f, 7);
    float *logits = malloc((size_t)vocab * sizeof *logits);
    uint32_t *mask = calloc(((size_t)tr.vocab_size + 31) / 32, sizeof *mask);
    double *tm = malloc((size_t)reps * mask_n * sizeof *tm);
    double *td = malloc((size_t)reps * decode_n * sizeof *td);
    double *ts = malloc((size_t)reps * mask_n * sizeof *ts);
    double *tw = malloc((size_t)reps * mask_n * sizeof *tw);
    double *to = malloc((size_t)reps * mask_n * sizeof *to);   /* the mask alone */
    if (!logits || !mask || !tm || !td || !ts || !tw || !to)
        return 1;
    uint64_t rng = 11;
    kvp_gmatch gm;
    kvp_gmatch_init(&gm, g);
    t0 = kvp_now();
    if (max_tokens > 0 && kvp_gmatch_bind(&gm, &tr) < 0)
        return 1;
    if (max_tokens > 0)
        printf("distances in tokens (kvp_gmatch_bind, once per reply): %.2f ms; the shortest "
               "document %d tokens (%d bytes)\n", (kvp_now() - t0) * 1e3,
               kvp_gmatch_distance(&gm), kvp_grammar_min_len(g));
    if (max_tokens > 0 && kvp_gmatch_distance(&gm) > max_tokens) {
        fprintf(stderr, "bench_grammar: the schema's shortest document takes %d tokens, more "
                "than --max-tokens %d\n", kvp_gmatch_distance(&gm), max_tokens);
        return 2;
    }
    int docs = 0, n_m = 0, n_d = 0, n_s = 0, pos = 0, gen = 0;
    long cut = 0, hits = 0, shaped = 0;
    long allowed_sum = 0;
    for (int i = 0; i < 4; i++) {   /* warm-up: weights faulted in */
        int tok = 3 + i;
        kvp_forward(&m, &rs, &c, &tok, 1, NULL);
    }
    for (int r = 0; r < reps; r++) {
        /* A: constrained steps */
        for (int i = 0; i < mask_n; i++) {
            random_logits(logits, vocab, &rng);
            double a = kvp_now();
            int n = max_tokens > 0 ? kvp_gmatch_mask_left(&gm, &tr, mask, max_tokens - gen)
                                   : kvp_gmatch_mask(&gm, &tr, mask);
            to[n_m] = (kvp_now() - a) * 1e6;
            shaped += gm.shaped;
            kvp_grammar_apply_mask(logits, mask, vocab);
            int tok = kvp_sample(&smp, logits);
            int end = tok == tr.end_tok[0];
            size_t len = 0;
            const char *p = kvp_tokenizer_piece(&m.tok, -1, tok, &len);
            if (!end)
                kvp_gmatch_accept(&gm, p, len);
            gen += !end;
            end |= max_tokens > 0 && gen >= max_tokens;
            tm[n_m] = (kvp_now() - a) * 1e6;
            tw[n_m++] = (double)gm.mask_work;
            allowed_sum += n;
            if (end || n <= 0) {   /* the document is done: the next one */
                if (max_tokens > 0 && !kvp_gmatch_complete(&gm)) {
                    fprintf(stderr, "bench_grammar: a reply ended unfinished\n");
                    return 1;
                }
                cut += gm.cut_walks;
                hits += gm.cache_hits;
                kvp_gmatch_free(&gm);
                kvp_gmatch_init(&gm, g);
                if (max_tokens > 0 && kvp_gmatch_bind(&gm, &tr) < 0)
                    return 1;
                docs++;
                gen = 0;
            }
        }
        /* B: decode steps */
        for (int i = 0; i < decode_n; i++) {
            if (pos + 1 >= m.cfg.seq_len) {
                kvp_cache_reset(&c);
                pos = 0;
            }
            int tok = 3 + (int)(((unsigned)(pos + 1) * 7919u) % (unsigned)(vocab - 3));
            double a = kvp_now();
            kvp_forward(&m, &rs, &c, &tok, 1, NULL);
            td[n_d++] = (kvp_now() - a) * 1e6;
            pos++;
        }
        /* C: the plain sampler */
        for (int i = 0; i < mask_n; i++) {
            random_logits(logits, vocab, &rng);
            double a = kvp_now();
            kvp_sample(&smp, logits);
            ts[n_s++] = (kvp_now() - a) * 1e6;
        }
    }
    cut += gm.cut_walks;
    hits += gm.cache_hits;
    double mean = 0;
    for (int i = 0; i < n_m; i++)
        mean += tm[i] / n_m;
    double m50 = pct(tm, n_m, 0.5), m90 = pct(tm, n_m, 0.9);
    double d50 = pct(td, n_d, 0.5), s50 = pct(ts, n_s, 0.5);
    double w50 = pct(tw, n_m, 0.5), w_max = pct(tw, n_m, 1.0);
    double o50 = pct(to, n_m, 0.5), o90 = pct(to, n_m, 0.9);
    double la[3] = {0};
    if (getloadavg(la, 3) < 0)
        la[0] = -1;
    printf("constrained step (mask + -inf + accept): median %.1f us, p90 %.1f us, mean %.1f us, "
           "over %d steps (%d documents finished, %.0f tokens allowed per step on average, "
           "%ld walks cut by the budget)\n", m50, m90, mean, n_m, docs,
           (double)allowed_sum / n_m, cut);
    if (max_tokens > 0)
        printf("length budget on (replies of at most %d tokens, every one finished whole): "
               "%ld of %d masks from the cache, %ld shaped by the budget\n", max_tokens, hits,
               n_m, shaped);
    printf("mask work: median %.0f units, max %.0f (budget %ld for this vocabulary)\n", w50,
           w_max, kvp_grammar_mask_budget(&tr));
    printf("decode step of %s: median %.1f us over %d steps\n", path, d50, n_d);
    printf("plain sampler (kvp_sample, T 1): median %.1f us over %d draws\n", s50, n_s);
    printf("mask / decode step: median %.3f, mean %.3f; mask / sampler: median %.2f\n",
           m50 / d50, mean / d50, m50 / s50);
    printf("the mask alone (%s): median %.1f us, p90 %.1f us; / decode step: median %.4f, "
           "p90 %.4f\n", max_tokens > 0 ? "kvp_gmatch_mask_left" : "kvp_gmatch_mask", o50, o90,
           o50 / d50, o90 / d50);
    printf("load average: %.2f %.2f %.2f\n", la[0], la[1], la[2]);
    kvp_gmatch_free(&gm);
    kvp_grammar_unref(g);
    kvp_vocab_trie_free(&tr);
    kvp_sampler_free(&smp);
    kvp_cache_free(&c);
    kvp_runstate_free(&rs);
    kvp_model_free(&m);
    free(logits);
    free(mask);
    free(tm);
    free(td);
    free(ts);
    free(tw);
    free(to);
    return 0;
}
