/* `kvp quantize`: rewrites a GGUF model with its matrices in another type or one of the
 * K mixtures (tools/quantmix.h says which tensor gets which type). Metadata is copied
 * as it is, general.file_type excepted; tensors are converted one row at a time, so
 * memory stays at the size of the mapping plus a row. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/gguf.h"
#include "model/quant.h"
#include "tools/cli.h"
#include "tools/quantmix.h"

typedef struct job {
    const kvp_gguf *in;
    uint32_t *types;     /* [n_tensors] output type of each tensor */
    float *row;          /* one row as f32 */
} job;

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvp quantize --in FILE --out FILE --type TYPE\n"
            "TYPE: " KVP_QUANT_MIX_NAMES "\n"
            "Plain types put every matrix in that type; q4_K_M / q5_K_M follow llama.cpp's\n"
            "choice (q6_K for the output and for attn_v / ffn_down of some layers). Norms\n"
            "stay f32. K types on rows that are not a multiple of 256 fall back to q5_0,\n"
            "q5_1 or q8_0.\n");
}

static int fill(void *ctx, uint64_t i, void *buf, uint64_t n_bytes)
{
    job *j = ctx;
    const kvp_gguf_tensor *t = &j->in->tensors[i];
    uint64_t ne0 = t->ne[0], rows = t->n_elements / ne0;
    size_t in_row = (size_t)(t->n_bytes / rows), out_row = (size_t)(n_bytes / rows);
    for (uint64_t r = 0; r < rows; r++) {
        const uint8_t *src = (const uint8_t *)t->data + r * in_row;
        if (kvp_dequantize(t->type, src, j->row, ne0) ||
            kvp_quantize(j->types[i], j->row, (uint8_t *)buf + r * out_row, ne0))
            return -EINVAL;
    }
    return 0;
}

int kvp_cmd_quantize(int argc, char **argv)
{
    const char *in = NULL, *out = NULL, *type = NULL;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h")) {
            usage(stdout);
            return 0;
        }
        if (i + 1 >= argc) {
            fprintf(stderr, "kvp quantize: %s needs a value\n", argv[i]);
            usage(stderr);
            return 2;
        }
        const char **slot = !strcmp(argv[i], "--in") ? &in : !strcmp(argv[i], "--out") ? &out
                          : !strcmp(argv[i], "--type") ? &type : NULL;
        if (!slot) {
            fprintf(stderr, "kvp quantize: unknown option '%s'\n", argv[i]);
            usage(stderr);
            return 2;
        }
        *slot = argv[++i];
    }
    kvp_quant_mix mix;
    if (!in || !out || !type) {
        fprintf(stderr, "kvp quantize: --in, --out and --type are required\n");
        usage(stderr);
        return 2;
    }
    if (kvp_quant_mix_parse(type, &mix)) {
        fprintf(stderr, "kvp quantize: unknown --type '%s' (%s)\n", type, KVP_QUANT_MIX_NAMES);
        return 2;
    }

    kvp_gguf g;
    char err[512];
    if (kvp_gguf_open(&g, in, err, sizeof err)) {
        fprintf(stderr, "kvp quantize: %s: %s\n", in, err);
        return 1;
    }
    int rc = 1, n_layers = 0, tied = !kvp_gguf_find_tensor(&g, "output.weight");
    uint64_t widest = 1, bytes_in = 0, bytes_out = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)g.tensors[i].name.len, g.tensors[i].name.ptr);
        int l;
        if (sscanf(name, "blk.%d.", &l) == 1 && l >= 0 && l < 1 << 20 && l + 1 > n_layers)
            n_layers = l + 1;
        widest = g.tensors[i].ne[0] > widest ? g.tensors[i].ne[0] : widest;
    }
    job j = {.in = &g, .types = calloc(g.n_tensors ? g.n_tensors : 1, sizeof *j.types),
             .row = malloc(widest * sizeof(float))};
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    char tmp[4096];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", out, (long)getpid());
    FILE *f = NULL;
    if (!j.types || !j.row || !w) {
        fprintf(stderr, "kvp quantize: out of memory\n");
        goto done;
    }
    for (uint64_t i = 0; i < g.n_kv; i++) {
        const kvp_gguf_str *k = &g.kv[i].key;
        if ((k->len == 17 && !memcmp(k->ptr, "general.file_type", 17)) ||
            (k->len == 17 && !memcmp(k->ptr, "general.alignment", 17)))
            continue;  /* rewritten / the writer's own alignment */
        kvp_gguf_writer_copy_kv(w, &g.kv[i]);
    }
    kvp_gguf_writer_add_u32(w, "general.file_type", mix.ftype);
    int requantized = 0;
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const kvp_gguf_tensor *t = &g.tensors[i];
        char name[256];
        snprintf(name, sizeof name, "%.*s", (int)t->name.len, t->name.ptr);
        j.types[i] = kvp_quant_mix_type(&mix, name, t->ne[0], t->n_dims, n_layers, tied);
        if (t->type != KVP_GGML_F32 && t->type != KVP_GGML_F16 && t->type != KVP_GGML_BF16 &&
            t->type != j.types[i])
            requantized++;
        bytes_in += t->n_bytes;
        bytes_out += kvp_type_nbytes(j.types[i], t->n_elements);
        kvp_gguf_writer_add_tensor(w, name, j.types[i], t->n_dims, t->ne);
    }
    if (requantized)
        fprintf(stderr, "kvp quantize: note: %d tensors were already quantized; they are decoded "
                "and quantized again (quality is that of both steps)\n", requantized);
    if (!(f = fopen(tmp, "wb"))) {
        fprintf(stderr, "kvp quantize: %s: %s\n", tmp, strerror(errno));
        goto done;
    }
    int wrc = kvp_gguf_writer_write(w, f, fill, &j, err, sizeof err);
    int crc = fclose(f);
    if (wrc || crc || rename(tmp, out)) {
        fprintf(stderr, "kvp quantize: %s: %s\n", out, wrc ? err : strerror(errno));
        remove(tmp);
        goto done;
    }
    printf("wrote %s (%s): %llu tensors, %.1f MB -> %.1f MB\n", out, type,
           (unsigned long long)g.n_tensors, (double)bytes_in / 1e6, (double)bytes_out / 1e6);
    rc = 0;
done:
    kvp_gguf_writer_free(w);
    free(j.types);
    free(j.row);
    kvp_gguf_close(&g);
    return rc;
}
