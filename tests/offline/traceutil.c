/* The small synthetic trace the training and calibration tests learn from, and `kvp`
 * run from the build. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/half.h"
#include "model/sampler.h"
#include "tests/model/testutil.h"
#include "tests/offline/traceutil.h"


/* Queries point along one direction per head, so a row's future attention follows its
 * key's projection on it: a ranking an agent can learn from keys. */
void make_trace_grid(const char *dir, int cut_min)
{
    char path[512];
    snprintf(path, sizeof path, "%s/trace.kvpt", dir);
    cr_assert(mkdir(dir, 0777) == 0 || errno == EEXIST);
    kvp_trace_header h = {.n_layers = T_LAYERS, .n_heads = T_HEADS, .n_kv_heads = T_KVH,
                          .head_dim = T_D, .seq_len = T_LEN, .split = 0.75,
                          .cut_min = cut_min, .cut_stride = 8, .cut_tail = 8};
    snprintf(h.model, sizeof h.model, "synthetic");
    kvp_trace_writer w;
    char err[256];
    cr_assert_eq(kvp_trace_writer_open(&w, path, &h, err, sizeof err), 0, "%s", err);
    static float q[T_LAYERS][T_LEN * T_HEADS * T_D], k[T_LAYERS][T_LEN * T_KVH * T_D],
        v[T_LAYERS][T_LEN * T_KVH * T_D];
    int32_t tokens[T_LEN];
    uint64_t rng = 77;
    for (int seq = 0; seq < T_SEQS; seq++) {
        for (int i = 0; i < T_LEN; i++)
            tokens[i] = i % 32;
        for (int l = 0; l < T_LAYERS; l++) {
            for (int i = 0; i < T_LEN * T_KVH * T_D; i++) {
                k[l][i] = 2.0f * kvp_rand_f32(&rng) - 1.0f;
                v[l][i] = 2.0f * kvp_rand_f32(&rng) - 1.0f;
            }
            for (int t = 0; t < T_LEN; t++)
                for (int hh = 0; hh < T_HEADS; hh++)
                    for (int x = 0; x < T_D; x++)
                        q[l][(t * T_HEADS + hh) * T_D + x] =
                            (x == (l + hh / T_GROUP) % T_D ? 6.0f : 0.0f) +
                            0.5f * (kvp_rand_f32(&rng) - 0.5f);
        }
        const float *qp[T_LAYERS], *kp[T_LAYERS], *vp[T_LAYERS];
        for (int l = 0; l < T_LAYERS; l++) {
            qp[l] = q[l];
            kp[l] = k[l];
            vp[l] = v[l];
        }
        cr_assert_eq(kvp_trace_writer_add(&w, tokens, T_LEN, qp, kp, vp), 0);
    }
    cr_assert_eq(kvp_trace_writer_close(&w, T_TRAIN, err, sizeof err), 0, "%s", err);
}

/* Episodes at cuts 32, 40, ..., 88. */
void make_trace(const char *dir)
{
    make_trace_grid(dir, 32);
}

const char *trace_dir(void)
{
    static char dir[64];
    if (!dir[0]) {
        snprintf(dir, sizeof dir, "/tmp/kvp-train-test-%d", (int)getpid());
        make_trace(dir);
    }
    return dir;
}

void open_trace(kvp_trace *t)
{
    char path[256], err[256];
    snprintf(path, sizeof path, "%s/trace.kvpt", trace_dir());
    cr_assert_eq(kvp_trace_open(t, path, NULL, err, sizeof err), 0, "%s", err);
}

void remove_trace(void)
{
    char cmd[256];
    snprintf(cmd, sizeof cmd, "rm -rf %s", trace_dir());
    cr_assert_eq(system(cmd), 0);
}

const kvp_agent_arch tiny_arch = {.d = T_D, .P = 8, .E = 4, .H = 8, .pmax = T_LEN};

/* `kvp SUB ARGS` with stderr in *out; its exit status. */
int run_kvp(const char *sub, const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s %s %s 2>&1", tu_build("tools/kvp"), sub, args);
    return tu_run(cmd, out);
}

void framed_rows(const kvp_trace *t, int seq, int layer, int kvh, int n, const kvp_rope *rope,
                 float *k, float *v)
{
    const uint16_t *tk = kvp_trace_k(t, seq, layer, kvh), *tv = kvp_trace_v(t, seq, layer, kvh);
    for (int i = 0; i < n * T_D; i++) {
        k[i] = kvp_f16_to_f32(tk[i]);
        v[i] = kvp_f16_to_f32(tv[i]);
    }
    for (int j = 0; j < T_D; j++) {   /* the mean key, in double, by hand */
        double a = 0.0;
        for (int i = 0; i < n; i++)
            a += k[i * T_D + j];
        float mean = (float)(a / n);
        for (int i = 0; i < n; i++)
            k[i * T_D + j] -= mean;
    }
    for (int i = 0; rope && i < n; i++)
        kvp_rope_rotate(rope, k + i * T_D, -(double)n);
}

long heldout_story_ids(const kvp_model *m, size_t max_bytes, int **ids)
{
    size_t len;
    char *text = tu_slurp(tu_shared("datasets/tinystories/tinystories-dev.txt"), &len);
    size_t at = kvp_trace_split_at(text, len, 0.8);
    long n = kvp_trace_tokenize(&m->tok, text + at, max_bytes, ids);
    free(text);
    return n;
}
