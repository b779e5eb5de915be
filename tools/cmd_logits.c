/* kvp logits: the logits of every position of a token sequence, as other engines'
 * debugging tools write them, for comparing kvpd's forward pass with a reference.
 * The tokens run as one causal block from position 0 (no BOS is added). */
#include <errno.h>
#include <getopt.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "tools/cli.h"
#include "base/parse.h"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp logits --model PATH --tokens ID,ID,... --out FILE\n"
        "  --model PATH      GGUF or llama2.c checkpoint\n"
        "  --tokenizer PATH  tokenizer.bin for llama2.c checkpoints (default: beside the model)\n"
        "  --tokens LIST     comma-separated token ids, run from position 0 (BOS is not added)\n"
        "  --out FILE        writes little-endian f32 [n][vocab]: the logits of every position\n");
}

/* Parses "1,2,3" (ids in [0, INT32_MAX], no empty fields) into a malloc'd array. */
static int parse_tokens(const char *s, int **out, int *n)
{
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int *ids = malloc(cap * sizeof *ids);
    if (!ids)
        return -ENOMEM;
    *n = 0;
    for (const char *p = s;; p++) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        char field[24];
        long v;
        if (len == 0 || len >= sizeof field) {
            free(ids);
            return -EINVAL;
        }
        memcpy(field, p, len);
        field[len] = 0;
        if (!kvp_parse_long(field, 0, INT32_MAX, &v)) {
            free(ids);
            return -EINVAL;
        }
        ids[(*n)++] = (int)v;
        if (!end)
            break;
        p = end;
    }
    *out = ids;
    return 0;
}

/* n floats as little-endian f32, whatever the host's byte order */
static int write_le(FILE *f, const float *x, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        unsigned char b[4] = {(unsigned char)u, (unsigned char)(u >> 8),
                              (unsigned char)(u >> 16), (unsigned char)(u >> 24)};
        if (fwrite(b, 1, 4, f) != 4)
            return -EIO;
    }
    return 0;
}

int kvp_cmd_logits(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *tokens = NULL, *out_path = NULL;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'z'}, {"tokens", 1, 0, 't'},
        {"out", 1, 0, 'o'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o, idx = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        switch (o) {
        case 'm': model_path = optarg; break;
        case 'z': tok_path = optarg; break;
        case 't': tokens = optarg; break;
        case 'o': out_path = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (!model_path || !tokens || !out_path || optind < argc) {
        fprintf(stderr, "kvp logits: %s\n", optind < argc ? "unexpected argument"
                                                          : "--model, --tokens and --out are required");
        usage(stderr);
        return 2;
    }
    int *ids = NULL, n = 0;
    int rc = parse_tokens(tokens, &ids, &n);
    if (rc) {
        fprintf(stderr, "kvp logits: --tokens '%.64s%s': %s\n", tokens, strlen(tokens) > 64 ? "..." : "",
                rc == -ENOMEM ? "out of memory" : "expected comma-separated token ids");
        return rc == -ENOMEM ? 1 : 2;
    }

    char err[512];
    kvp_model m;
    if (kvp_model_load(&m, model_path, tok_path, err, sizeof err)) {
        fprintf(stderr, "kvp logits: %s\n", err);
        free(ids);
        return 1;
    }
    const kvp_model_config *c = &m.cfg;
    int status = 1;
    kvp_runstate s;
    kvp_cache cache;
    float *logits = NULL;
    FILE *f = NULL;
    int have_state = 0, have_cache = 0;
    for (int i = 0; i < n; i++)
        if (ids[i] >= c->vocab_size) {
            fprintf(stderr, "kvp logits: token %d (position %d) is not below the vocabulary "
                    "size %d\n", ids[i], i, c->vocab_size);
            status = 2;
            goto out;
        }
    if (n > c->seq_len) {
        fprintf(stderr, "kvp logits: %d tokens exceed the model's context of %d\n", n, c->seq_len);
        status = 2;
        goto out;
    }
    logits = malloc((size_t)n * c->vocab_size * sizeof *logits);
    if (!logits || kvp_runstate_init(&s, c, n)) {
        fprintf(stderr, "kvp logits: out of memory\n");
        goto out;
    }
    have_state = 1;
    if (kvp_cache_init(&cache, c->n_layers, c->n_kv_heads, c->head_dim, &c->rope)) {
        fprintf(stderr, "kvp logits: out of memory\n");
        goto out;
    }
    have_cache = 1;
    if ((rc = kvp_forward(&m, &s, &cache, ids, n, logits))) {
        fprintf(stderr, "kvp logits: forward pass failed: %s\n", strerror(-rc));
        goto out;
    }
    if (!(f = fopen(out_path, "wb"))) {
        fprintf(stderr, "kvp logits: cannot create %s: %s\n", out_path, strerror(errno));
        goto out;
    }
    if (write_le(f, logits, (size_t)n * c->vocab_size) || fclose(f)) {
        f = NULL;
        fprintf(stderr, "kvp logits: cannot write %s: %s\n", out_path, strerror(errno));
        remove(out_path);
        goto out;
    }
    f = NULL;
    printf("wrote %s: %d positions x %d logits (f32 little-endian)\n", out_path, n, c->vocab_size);
    status = 0;
out:
    if (f)
        fclose(f);
    if (have_cache)
        kvp_cache_free(&cache);
    if (have_state)
        kvp_runstate_free(&s);
    free(logits);
    free(ids);
    kvp_model_free(&m);
    return status;
}
