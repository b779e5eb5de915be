/* kvp generate: text from a model, optionally under a cache budget with a policy. */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "generate/generate.h"
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
        "  --seed S             sampling seed (default: time)\n"
        "  --policy NAME        eviction policy: %s (default none)\n"
        "  --policy-file F      KVP policy file (for --policy kvp)\n"
        "  --budget B           rows kept per KV head (default 0 = unbounded)\n"
        "  --sinks N            oldest rows always kept (default " KVP_STR(KVP_DEFAULT_SINKS) ")\n"
        "  --recent N           newest rows always kept (default " KVP_STR(KVP_DEFAULT_RECENT) ")\n"
        "  --chunk N            eviction chunk (default " KVP_STR(KVP_DEFAULT_CHUNK) ")\n"
        "  --ignore-eos         go on past the end of a text (BOS/EOS print as a newline)\n",
        kvp_policy_names());
}

/* Writes a piece, dropping ASCII control bytes other than whitespace (as llama2.c does). */
static void emit(const char *p, size_t n)
{
    if (n == 1 && (unsigned char)p[0] < 0x20 && !strchr("\t\n\r", p[0]))
        return;
    fwrite(p, 1, n, stdout);
}

/* Rows and bytes of every (layer, KV head) store: what the budget bounds. */
static void report_cache(const kvp_cache *c)
{
    fprintf(stderr, "cache: %zu bytes, %zu rows, %llu evicted, %llu shifts; per head rows/bytes:",
            kvp_cache_bytes(c), kvp_cache_rows(c), (unsigned long long)c->evicted_rows,
            (unsigned long long)c->shifts);
    for (int l = 0; l < c->n_layers; l++) {
        fprintf(stderr, " L%d[", l);
        for (int h = 0; h < c->n_kv_heads; h++) {
            const kvp_head *hd = kvp_cache_head(c, l, h);
            fprintf(stderr, h ? " %d/%zu" : "%d/%zu", hd->n, kvp_head_bytes(c, hd));
        }
        fprintf(stderr, "]");
    }
    fprintf(stderr, "\n");
}

int kvp_cmd_generate(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *prompt = "", *policy_name = "none",
               *policy_file = NULL;
    long steps = 256, seed = (long)time(NULL), budget = 0, sinks = KVP_DEFAULT_SINKS,
         recent = KVP_DEFAULT_RECENT, chunk = KVP_DEFAULT_CHUNK;
    double temperature = 1.0, top_p = 0.9;
    int ignore_eos = 0;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'z'}, {"prompt", 1, 0, 'i'},
        {"steps", 1, 0, 'n'}, {"temperature", 1, 0, 't'}, {"top-p", 1, 0, 'p'},
        {"seed", 1, 0, 's'}, {"policy", 1, 0, 'P'}, {"policy-file", 1, 0, 'F'},
        {"budget", 1, 0, 'b'}, {"sinks", 1, 0, 'S'}, {"recent", 1, 0, 'R'},
        {"chunk", 1, 0, 'c'}, {"ignore-eos", 0, 0, 'E'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
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
        case 's': ok = kvp_parse_long(optarg, 0, LONG_MAX, &seed); break;
        case 'P': policy_name = optarg; break;
        case 'F': policy_file = optarg; break;
        case 'b': ok = kvp_parse_long(optarg, 0, 1L << 24, &budget); break;
        case 'S': ok = kvp_parse_long(optarg, 0, 1L << 20, &sinks); break;
        case 'R': ok = kvp_parse_long(optarg, 0, 1L << 20, &recent); break;
        case 'c': ok = kvp_parse_long(optarg, 1, 1L << 16, &chunk); break;
        case 'E': ignore_eos = 1; break;
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
    if (budget > 0 && budget + chunk >= m.cfg.seq_len) {
        fprintf(stderr, "kvp generate: --budget %ld + --chunk %ld must stay below the model's "
                "context length %d\n", budget, chunk, m.cfg.seq_len);
        kvp_model_free(&m);
        return 2;
    }
    int status = 1;
    kvp_policy *policy = NULL;
    kvp_runstate s;
    kvp_cache c;
    kvp_sampler smp;
    int *tokens = NULL;
    int have_s = 0, have_c = 0, have_smp = 0;
    if (kvp_policy_create(&policy, policy_name, policy_file, &m.cfg, (uint64_t)seed, err, sizeof err)) {
        fprintf(stderr, "kvp generate: %s\n", err);
        goto out;
    }
    policy->n_sink = (int)sinks;
    policy->n_recent = (int)recent;
    kvp_evict_cfg ev = {policy, (int)budget, (int)chunk};

    size_t plen = strlen(prompt);
    tokens = malloc((size_t)(plen + 3) * sizeof *tokens);
    int chunk_tokens = (int)(chunk > 256 ? chunk : 256);
    if (!tokens || kvp_runstate_init(&s, &m.cfg, chunk_tokens) || !(have_s = 1) ||
        kvp_cache_init(&c, m.cfg.n_layers, m.cfg.n_kv_heads, m.cfg.head_dim, &m.cfg.rope) ||
        !(have_c = 1) ||
        kvp_sampler_init(&smp, m.cfg.vocab_size, (float)temperature, (float)top_p, (uint64_t)seed) ||
        !(have_smp = 1)) {
        fprintf(stderr, "kvp generate: out of memory\n");
        goto out;
    }
    int n_prompt = kvp_tokenizer_encode(&m.tok, prompt, plen, KVP_ENCODE_BOS, tokens, (int)plen + 3);
    if (n_prompt < 1) {
        fprintf(stderr, "kvp generate: cannot tokenize the prompt\n");
        goto out;
    }
    if (n_prompt > steps)
        n_prompt = (int)steps;

    double t0 = kvp_now();
    int rc = kvp_gen_prefill(&m, &s, &c, &ev, tokens, n_prompt, NULL);
    double t1 = kvp_now();
    /* llama2.c's loop: `steps` forward passes in all (prompt included); the logits of
     * each pass from the last prompt token on are sampled and printed */
    int prev = tokens[n_prompt - 1], generated = 0;
    long forwards = n_prompt;
    while (rc == 0) {
        int next = kvp_sample(&smp, s.logits);
        int boundary = next == m.tok.bos_id || next == m.tok.eos_id || next == m.tok.eot_id;
        if (boundary && !ignore_eos)
            break;
        size_t n;
        const char *piece = boundary ? "\n" : kvp_tokenizer_piece(&m.tok, prev, next, &n);
        if (boundary)
            n = 1;
        if (piece)
            emit(piece, n);
        generated++;
        prev = next;
        if (forwards >= steps)
            break;
        rc = kvp_gen_decode(&m, &s, &c, &ev, next);
        forwards++;
    }
    double t2 = kvp_now();
    if (rc) {
        fprintf(stderr, "\nkvp generate: %s\n", rc == -E2BIG
                ? "context full: the model's context length is reached (use --budget to evict)"
                : strerror(-rc));
        goto out;
    }
    printf("\n");
    fprintf(stderr, "prefill: %d tokens, %.1f tok/s; decode: %d tokens, %.1f tok/s; policy %s, budget %ld\n",
            n_prompt, n_prompt / (t1 - t0 > 0 ? t1 - t0 : 1e-9), generated,
            generated / (t2 - t1 > 0 ? t2 - t1 : 1e-9), policy_name, budget);
    if (budget > 0)
        report_cache(&c);
    status = 0;
out:
    if (have_smp)
        kvp_sampler_free(&smp);
    if (have_c)
        kvp_cache_free(&c);
    if (have_s)
        kvp_runstate_free(&s);
    free(tokens);
    kvp_policy_destroy(policy);
    kvp_model_free(&m);
    return status;
}
