/* kvp generate: text from a model, optionally under a cache budget with a policy;
 * --parallel N runs N sequences of the prompt (seeds S, S+1, ...) in batched steps. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "generate/generate.h"
#include "model/matmul.h"
#include "model/sampler.h"
#include "tools/cli.h"
#include "base/parse.h"
#include "base/clock.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp generate --model PATH [options]\n"
        "  --model PATH         GGUF or llama2.c checkpoint\n"
        "  --tokenizer PATH     tokenizer.bin for llama2.c checkpoints (default: beside the model)\n"
        "  --prompt TEXT        prompt (default: empty, start from BOS)\n"
        "  --steps N            sequence length, prompt included, as in llama2.c (default 256)\n"
        "  --temperature T      0 = greedy (default 1.0)\n"
        "  --top-p P            nucleus sampling threshold (default 0.9)\n"
        "  --top-k K            keep the K most likely tokens (default 0: all)\n"
        "  --min-p P            keep tokens with p >= P * p(most likely) (default 0)\n"
        "  --frequency-penalty F, --presence-penalty F   OpenAI's, over the reply (-2..2)\n"
        "  --repetition-penalty R   CTRL / llama.cpp's, over the reply (default 1: off)\n"
        "  --seed S             sampling seed (default: time)\n"
        "  --policy NAME        eviction policy: %s (default none)\n"
        "  --policy-file F      KVP policy file (for --policy kvp)\n"
        "  --budget B           rows kept per KV head (default 0 = unbounded)\n"
        "  --sinks N            oldest rows always kept (default " KVP_STR(KVP_DEFAULT_SINKS) ")\n"
        "  --recent N           newest rows always kept (default " KVP_STR(KVP_DEFAULT_RECENT) ")\n"
        "  --chunk N            eviction chunk (default " KVP_STR(KVP_DEFAULT_CHUNK) ")\n"
        "  --kv-type T          how cache rows are stored: f32, f16 or q8_0 (default f32)\n"
        "  --budget-mode M      per_head (every head keeps --budget rows) or global (the\n"
        "                       heads share budget x heads rows by calibrated score)\n"
        "  --ignore-eos         go on past the end of a text (BOS/EOS print as a newline)\n"
        "  --parallel N         N sequences of the prompt with seeds S..S+N-1, each with its own\n"
        "                       cache and policy, decoded in batched steps (default 1); their\n"
        "                       texts print at the end, each under a '--- sequence I (seed S)' line\n",
        kvp_policy_names());
}

/* Writes a piece, dropping ASCII control bytes other than whitespace (as llama2.c does). */
static void emit(FILE *f, const char *p, size_t n)
{
    if (n == 1 && (unsigned char)p[0] < 0x20 && !strchr("\t\n\r", p[0]))
        return;
    fwrite(p, 1, n, f);
}

/* Rows and bytes of every (layer, KV head) store: what the budget bounds. */
static void report_cache(const kvp_cache *c)
{
    fprintf(stderr, "cache: %zu bytes, %zu rows of %s, %llu evicted, %llu shifts; per head rows/bytes:",
            kvp_cache_bytes(c), kvp_cache_rows(c), kvp_kv_type_name(c->kv_type), (unsigned long long)c->evicted_rows,
            (unsigned long long)c->shifts);
    for (int l = 0; l < c->n_layers; l++) {
        /* a sliding-window layer: "w" and its window (the budget does not bound it) */
        if (kvp_cache_window(c, l))
            fprintf(stderr, " L%dw%d[", l, kvp_cache_window(c, l));
        else
            fprintf(stderr, " L%d[", l);
        for (int h = 0; h < c->n_kv_heads; h++) {
            const kvp_head *hd = kvp_cache_head(c, l, h);
            fprintf(stderr, h ? " %d/%zu" : "%d/%zu", hd->n, kvp_head_bytes(c, hd));
        }
        fprintf(stderr, "]");
    }
    fprintf(stderr, "\n");
}

/* One sequence: its cache, policy and sampler, where its prompt stands, its text. */
typedef struct gen_seq {
    kvp_cache cache;
    kvp_policy *policy;
    kvp_sampler smp;
    kvp_evict_cfg ev;
    int have_cache, have_smp;
    int fed;             /* prompt tokens run */
    int next;            /* the sampled token the next step runs */
    int prev;            /* the token before it, for its piece */
    long forwards;       /* forward passes, prompt tokens included */
    int generated;
    int done;
    double t_prefilled;
    FILE *out;           /* stdout alone, else a memory stream printed at the end */
    char *text;
    size_t text_len;
} gen_seq;

static void seq_free(gen_seq *q)
{
    if (q->have_smp)
        kvp_sampler_free(&q->smp);
    if (q->have_cache)
        kvp_cache_free(&q->cache);
    kvp_policy_destroy(q->policy);
    if (q->out && q->out != stdout)
        fclose(q->out);
    free(q->text);
}

/* A step's draws on the matmul pool, one sequence per item (each has its own sampler). */
typedef struct draw_job {
    gen_seq *seqs;
    const int *who;
    const kvp_batch_seq *batch;
    int n_prompt;
    int *tok;            /* -1: nothing to draw (a prompt block before the last, or failed) */
} draw_job;

static void draw_item(void *ctx, int j, int slot)
{
    draw_job *d = ctx;
    gen_seq *q = &d->seqs[d->who[j]];
    (void)slot;
    d->tok[j] = !d->batch[j].rc && q->fed + d->batch[j].n >= d->n_prompt
                    ? kvp_sample(&q->smp, d->batch[j].logits) : -1;
}

int kvp_cmd_generate(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *prompt = "", *policy_name = "none",
               *policy_file = NULL;
    long steps = 256, seed = (long)time(NULL), budget = 0, sinks = KVP_DEFAULT_SINKS,
         recent = KVP_DEFAULT_RECENT, chunk = KVP_DEFAULT_CHUNK, parallel = 1;
    double temperature = 1.0, top_p = 0.9, min_p = 0, freq_pen = 0, pres_pen = 0, rep_pen = 1;
    long top_k = 0;
    int ignore_eos = 0, kv_type = KVP_KV_F32, budget_mode = KVP_BUDGET_PER_HEAD;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'z'}, {"prompt", 1, 0, 'i'},
        {"steps", 1, 0, 'n'}, {"temperature", 1, 0, 't'}, {"top-p", 1, 0, 'p'},
        {"seed", 1, 0, 's'}, {"policy", 1, 0, 'P'}, {"policy-file", 1, 0, 'F'},
        {"budget", 1, 0, 'b'}, {"sinks", 1, 0, 'S'}, {"recent", 1, 0, 'R'},
        {"chunk", 1, 0, 'c'}, {"ignore-eos", 0, 0, 'E'}, {"parallel", 1, 0, 'N'},
        {"kv-type", 1, 0, 'K'}, {"budget-mode", 1, 0, 'M'},
        {"top-k", 1, 0, 1000}, {"min-p", 1, 0, 1001}, {"frequency-penalty", 1, 0, 1002},
        {"presence-penalty", 1, 0, 1003}, {"repetition-penalty", 1, 0, 1004},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o, idx = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        int ok = 1;
        switch (o) {
        case 'm': model_path = optarg; break;
        case 'z': tok_path = optarg; break;
        case 'i': prompt = optarg; break;
        case 'n': ok = kvp_parse_long(optarg, 1, 1L << 30, &steps); break;
        case 't': ok = kvp_parse_double(optarg, 0.0, 100.0, &temperature); break;
        case 'p': ok = kvp_parse_double(optarg, 1e-6, 1.0, &top_p); break;
        case 's': ok = kvp_parse_long(optarg, 0, LONG_MAX - 4096, &seed); break;
        case 'P': policy_name = optarg; break;
        case 'F': policy_file = optarg; break;
        case 'b': ok = kvp_parse_long(optarg, 0, 1L << 24, &budget); break;
        case 'S': ok = kvp_parse_long(optarg, 0, 1L << 20, &sinks); break;
        case 'R': ok = kvp_parse_long(optarg, 0, 1L << 20, &recent); break;
        case 'c': ok = kvp_parse_long(optarg, 1, 1L << 16, &chunk); break;
        case 'E': ignore_eos = 1; break;
        case 'K': ok = (kv_type = kvp_kv_type_parse(optarg)) >= 0; break;
        case 'M': ok = (budget_mode = kvp_budget_mode_parse(optarg)) >= 0; break;
        case 'N': ok = kvp_parse_long(optarg, 1, 4096, &parallel); break;
        case 1000: ok = kvp_parse_long(optarg, 0, 1L << 30, &top_k); break;
        case 1001: ok = kvp_parse_double(optarg, 0.0, 1.0, &min_p); break;
        case 1002: ok = kvp_parse_double(optarg, -2.0, 2.0, &freq_pen); break;
        case 1003: ok = kvp_parse_double(optarg, -2.0, 2.0, &pres_pen); break;
        case 1004: ok = kvp_parse_double(optarg, 1e-3, 10.0, &rep_pen); break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok) {
            fprintf(stderr, "kvp generate: bad value '%s' for --%s\n", optarg, opts[idx].name);
            return 2;
        }
    }
    if (!model_path || optind < argc) {
        fprintf(stderr, "kvp generate: %s\n", model_path ? "unexpected argument" : "--model is required");
        usage(stderr);
        return 2;
    }
    if (budget > 0 && budget < sinks + recent) {
        fprintf(stderr, "kvp generate: --budget %ld is smaller than --sinks + --recent (%ld)\n",
                budget, sinks + recent);
        return 2;
    }

    char err[512];
    kvp_model m;
    if (kvp_model_load(&m, model_path, tok_path, err, sizeof err)) {
        fprintf(stderr, "kvp generate: %s\n", err);
        return 1;
    }
    kvp_model_use_cores(&m);
    if (budget > 0 && budget + chunk >= m.cfg.seq_len) {
        fprintf(stderr, "kvp generate: --budget %ld + --chunk %ld must stay below the model's "
                "context length %d\n", budget, chunk, m.cfg.seq_len);
        kvp_model_free(&m);
        return 2;
    }
    int N = (int)parallel, V = m.cfg.vocab_size;
    int status = 1, have_s = 0;
    kvp_runstate s;
    gen_seq *seqs = calloc((size_t)N, sizeof *seqs);
    kvp_batch_seq *batch = calloc((size_t)N, sizeof *batch);
    const kvp_evict_cfg **evict = calloc((size_t)N, sizeof *evict);
    int *who = calloc((size_t)N, sizeof *who), *drawn = calloc((size_t)N, sizeof *drawn);
    float *logits = malloc((size_t)N * V * sizeof *logits);
    size_t plen = strlen(prompt);
    int *tokens = malloc((size_t)(plen + 3) * sizeof *tokens);
    /* A prompt block per sequence and step: a chunk when evicting (the trigger's
     * bound), else up to 256 tokens. */
    int evicting = budget > 0 && strcmp(policy_name, "none") != 0;
    int block = (int)(evicting || chunk > 256 ? chunk : 256);
    if (!seqs || !batch || !evict || !who || !drawn || !logits || !tokens ||
        kvp_runstate_init(&s, &m.cfg, N * block) || !(have_s = 1)) {
        fprintf(stderr, "kvp generate: out of memory\n");
        goto out;
    }
    kvp_sample_opts sopts = {.top_k = (int)top_k, .min_p = (float)min_p,
                             .frequency_penalty = (float)freq_pen,
                             .presence_penalty = (float)pres_pen,
                             .repetition_penalty = (float)rep_pen};
    for (int i = 0; i < N; i++) {
        gen_seq *q = &seqs[i];
        uint64_t sd = (uint64_t)seed + (uint64_t)i;
        if (kvp_policy_create(&q->policy, policy_name, policy_file, &m.cfg, sd, err, sizeof err)) {
            fprintf(stderr, "kvp generate: %s\n", err);
            goto out;
        }
        q->policy->n_sink = (int)sinks;
        q->policy->n_recent = (int)recent;
        q->ev = (kvp_evict_cfg){q->policy, (int)budget, (int)chunk, budget_mode};
        q->out = N == 1 ? stdout : open_memstream(&q->text, &q->text_len);
        if (!q->out ||
            kvp_cache_init(&q->cache, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim, &m.cfg.rope) ||
            !(q->have_cache = 1) || kvp_cache_convert(&q->cache, (kvp_kv_type)kv_type) ||
            kvp_sampler_init(&q->smp, V, (float)temperature, (float)top_p, sd) || !(q->have_smp = 1) ||
            kvp_sampler_set_opts(&q->smp, &sopts)) {
            fprintf(stderr, "kvp generate: out of memory\n");
            goto out;
        }
    }
    int n_prompt = kvp_tokenizer_encode(&m.tok, prompt, plen, KVP_ENCODE_BOS, tokens, (int)plen + 3);
    if (n_prompt < 1) {
        fprintf(stderr, "kvp generate: cannot tokenize the prompt\n");
        goto out;
    }
    if (n_prompt > steps)
        n_prompt = (int)steps;

    /* Steps until every sequence is done: each running sequence gives its next prompt
     * block or its last sampled token. llama2.c's loop per sequence: `steps` forward
     * passes in all (prompt included); the logits of each pass from the last prompt
     * token on are sampled and printed. */
    double t0 = kvp_now(), t_prefilled = t0;
    int rc = 0, failed = -1;
    long n_steps = 0;
    for (;;) {
        int nb = 0;
        for (int i = 0; i < N; i++) {
            gen_seq *q = &seqs[i];
            if (q->done)
                continue;
            int n = n_prompt - q->fed < block ? n_prompt - q->fed : block;
            batch[nb] = (kvp_batch_seq){.cache = &q->cache, .logits = logits + (size_t)nb * V,
                                        .tokens = n > 0 ? tokens + q->fed : &q->next,
                                        .n = n > 0 ? n : 1};
            evict[nb] = &q->ev;
            who[nb++] = i;
        }
        if (nb == 0)
            break;
        if ((rc = kvp_gen_step(&m, &s, batch, evict, nb)))
            break;
        n_steps++;
        int prefilling = 0;
        draw_job dj = {seqs, who, batch, n_prompt, drawn};
        kvp_matmul_enter();
        kvp_matmul_parallel(nb, draw_item, &dj, (size_t)nb * (size_t)V * sizeof(float),
                            KVP_MATMUL_MAX_THREADS, 0);
        kvp_matmul_leave();
        for (int j = 0; j < nb; j++) {
            gen_seq *q = &seqs[who[j]];
            if ((rc = batch[j].rc)) {
                failed = who[j];
                break;
            }
            if (q->fed < n_prompt) {
                q->fed += batch[j].n;
                q->forwards += batch[j].n;
                prefilling = 1;
                if (q->fed < n_prompt)
                    continue;
                q->prev = tokens[n_prompt - 1];
            }
            int next = drawn[j];
            int boundary = next == m.tok.bos_id || next == m.tok.eos_id || next == m.tok.eot_id;
            if (boundary && !ignore_eos) {
                q->done = 1;
                continue;
            }
            size_t n;
            const char *piece = boundary ? "\n" : kvp_tokenizer_piece(&m.tok, q->prev, next, &n);
            if (boundary)
                n = 1;
            if (piece)
                emit(q->out, piece, n);
            q->generated++;
            q->prev = q->next = next;
            if (q->forwards >= steps)
                q->done = 1;
            else
                q->forwards++;
        }
        if (rc)
            break;
        if (prefilling)
            t_prefilled = kvp_now();
    }
    double t2 = kvp_now();
    if (rc) {
        char who_failed[32] = "";
        if (failed >= 0 && N > 1)
            snprintf(who_failed, sizeof who_failed, "sequence %d: ", failed);
        fprintf(stderr, "\nkvp generate: %s%s\n", who_failed, rc == -E2BIG
                ? "context full: the model's context length is reached (use --budget to evict)"
                : strerror(-rc));
        goto out;
    }
    long generated = 0;
    for (int i = 0; i < N; i++) {
        gen_seq *q = &seqs[i];
        generated += q->generated;
        if (q->out == stdout)
            continue;
        fclose(q->out);
        q->out = NULL;
        printf("--- sequence %d (seed %ld)\n", i, seed + i);
        fwrite(q->text, 1, q->text_len, stdout);
        printf("\n");
    }
    if (N == 1)
        printf("\n");
    fprintf(stderr, "prefill: %d tokens, %.1f tok/s; decode: %ld tokens, %.1f tok/s; policy %s, budget %ld\n",
            n_prompt * N, n_prompt * N / (t_prefilled - t0 > 0 ? t_prefilled - t0 : 1e-9),
            generated, generated / (t2 - t_prefilled > 0 ? t2 - t_prefilled : 1e-9), policy_name,
            budget);
    if (N > 1)
        fprintf(stderr, "parallel: %d sequences in %ld batched steps\n", N, n_steps);
    if (budget > 0)
        for (int i = 0; i < N; i++)
            report_cache(&seqs[i].cache);
    status = 0;
out:
    for (int i = 0; seqs && i < N; i++)
        seq_free(&seqs[i]);
    if (have_s)
        kvp_runstate_free(&s);
    free(seqs);
    free(batch);
    free(evict);
    free(who);
    free(drawn);
    free(logits);
    free(tokens);
    kvp_model_free(&m);
    return status;
}
