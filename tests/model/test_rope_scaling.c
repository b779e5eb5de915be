/* Linear RoPE scaling (model/rope_scaling.c): ARCH.rope.scaling.type / .factor added to
 * the ggml fixtures of ../shared/fixtures/arch. The reference is the unscaled model with
 * the positions divided by the factor: a token alone in its cache attends only to itself,
 * so every layer's input is independent of its position and each layer's key is the
 * unscaled key rotated to position / factor (gemma3's sliding-window layers: to the
 * position itself, as llama.cpp leaves them unscaled). The context shift and snapshots
 * keep each layer's rotation; other scaling types are refused naming the key. */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/forward.h"
#include "model/gguf.h"
#include "tests/model/testutil.h"

static const char *fixture(const char *name)
{
    static char rel[128];
    snprintf(rel, sizeof rel, "fixtures/arch/%s.gguf", name);
    return tu_shared(rel);
}

static int fill_from(void *ctx, uint64_t i, void *buf, uint64_t n)
{
    const kvp_gguf *g = ctx;
    cr_assert_eq(n, g->tensors[i].n_bytes);
    memcpy(buf, g->tensors[i].data, n);
    return 0;
}

/* The fixture with ARCH.rope.scaling.type = type (NULL: no key) and
 * ARCH.rope.scaling.factor = factor (-1: no key) added, written to a temp file. */
static const char *scaled(const char *name, const char *type, float factor)
{
    kvp_gguf g;
    char err[512], key[96];
    cr_assert_eq(kvp_gguf_open(&g, fixture(name), err, sizeof err), 0, "%s", err);
    char arch[32];
    cr_assert_eq(kvp_gguf_get_str(&g, "general.architecture", arch, sizeof arch), 0);
    kvp_gguf_writer *w = kvp_gguf_writer_new();
    for (uint64_t i = 0; i < g.n_kv; i++)
        cr_assert_eq(kvp_gguf_writer_copy_kv(w, &g.kv[i]), 0);
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    if (type)
        cr_assert_eq(kvp_gguf_writer_add_str(w, key, type), 0);
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    if (factor != -1.0f)
        cr_assert_eq(kvp_gguf_writer_add_f32(w, key, factor), 0);
    for (uint64_t i = 0; i < g.n_tensors; i++) {
        const kvp_gguf_tensor *t = &g.tensors[i];
        char tname[128];
        snprintf(tname, sizeof tname, "%.*s", (int)t->name.len, t->name.ptr);
        cr_assert_eq(kvp_gguf_writer_add_tensor(w, tname, t->type, t->n_dims, t->ne), 0);
    }
    char *mem = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&mem, &len);
    cr_assert(f);
    cr_assert_eq(kvp_gguf_writer_write(w, f, fill_from, &g, err, sizeof err), 0, "%s", err);
    fclose(f);
    kvp_gguf_writer_free(w);
    kvp_gguf_close(&g);
    const char *path = tu_write_tmp(mem, len);
    free(mem);
    return path;
}

static float max_diff(const float *a, const float *b, int n, float *top)
{
    float d = 0.0f;
    *top = 1.0f;
    for (int j = 0; j < n; j++) {
        d = fmaxf(d, fabsf(a[j] - b[j]));
        *top = fmaxf(*top, fabsf(b[j]));
    }
    return d;
}

/* Every layer's key of one token alone at position pos. keys: [n_layers][n_kv][hd]. */
static void keys_at(const kvp_model *m, int tok, int pos, float *keys)
{
    const kvp_model_config *p = &m->cfg;
    kvp_runstate s;
    kvp_cache c;
    cr_assert_eq(kvp_runstate_init(&s, p, 1), 0);
    cr_assert_eq(kvp_cache_init(&c, p->n_layers, p->n_kv_heads, p->head_dim, &p->rope), 0);
    c.next_pos = pos;
    cr_assert_eq(kvp_forward(m, &s, &c, &tok, 1, NULL), 0);
    for (int l = 0; l < p->n_layers; l++)
        for (int h = 0; h < p->n_kv_heads; h++) {
            const kvp_head *hh = kvp_cache_head(&c, l, h);
            cr_assert_eq(hh->n, 1);
            memcpy(keys + ((size_t)l * p->n_kv_heads + h) * p->head_dim, hh->k,
                   (size_t)p->head_dim * sizeof(float));
        }
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
}

/* positions[i] * factor in the scaled model against positions[i] in the unscaled one on
 * the scaled layers, and positions[i] * factor in both on the unscaled ones. */
static void check_keys(const char *name, float factor, int gemma3_local)
{
    kvp_model ref, sc;
    char err[512];
    cr_assert_eq(kvp_model_load(&ref, fixture(name), NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kvp_model_load(&sc, scaled(name, "linear", factor), NULL, err, sizeof err), 0,
                 "%s", err);
    const kvp_model_config *p = &ref.cfg;
    size_t per = (size_t)p->n_kv_heads * p->head_dim;
    float *want = malloc(p->n_layers * per * sizeof(float));
    float *want_local = malloc(p->n_layers * per * sizeof(float));
    float *got = malloc(p->n_layers * per * sizeof(float));
    static const int positions[] = {2, 4, 8, 12, 30};   /* times 2.5: integers */
    int scaled_layers = 0, local_layers = 0;
    for (size_t i = 0; i < sizeof positions / sizeof positions[0]; i++) {
        int tok = (int)(i * 53 + 5) % p->vocab_size;
        int pos = (int)lroundf(positions[i] * factor);
        keys_at(&ref, tok, positions[i], want);
        keys_at(&ref, tok, pos, want_local);
        keys_at(&sc, tok, pos, got);
        for (int l = 0; l < p->n_layers; l++) {
            int local = gemma3_local && ref.layers[l].window > 0;
            const float *w = (local ? want_local : want) + l * per;
            float top, d = max_diff(got + l * per, w, (int)per, &top);
            cr_expect_leq(d, 1e-5f * top, "%s x%g: layer %d (%s) at %d: off by %g", name,
                          factor, l, local ? "unscaled window" : "scaled", pos, d);
            local_layers += local;
            scaled_layers += !local;
        }
        /* and the scaling did change the key (the check above can fail) */
        float top, d = max_diff(want, want_local, (int)per, &top);
        cr_expect_gt(d, 1e-3f * top, "%s: positions %d and %d rotate layer 0 alike", name,
                     positions[i], pos);
    }
    cr_expect_gt(scaled_layers, 0);
    cr_expect(!gemma3_local || local_layers > 0);
    free(want);
    free(want_local);
    free(got);
    kvp_model_free(&sc);
    kvp_model_free(&ref);
}

Test(rope_scaling, llama_keys_rotate_to_position_over_factor) { check_keys("llama-plain", 4.0f, 0); }
Test(rope_scaling, llama_frequency_factors_and_non_power_of_two) { check_keys("llama-rope-freqs", 2.5f, 0); }
Test(rope_scaling, qwen3_neox) { check_keys("qwen3-qknorm", 2.0f, 0); }
/* gemma3: the global layer (5) scaled, the five sliding-window layers not */
Test(rope_scaling, gemma3_global_layers_only) { check_keys("gemma3-swa", 8.0f, 1); }
/* phi3: LongRoPE short factors times the linear factor, on every (windowed) layer */
Test(rope_scaling, phi3_windowed_layers_scaled) { check_keys("phi3-swa", 2.0f, 0); }

/* After a context shift, each kept layer-0 key equals the scaled model's key computed
 * directly at the row's new position; then the same through a snapshot. */
static void check_shift(const char *name, float factor)
{
    kvp_model m;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, scaled(name, NULL, factor), NULL, err, sizeof err), 0,
                 "%s", err);
    const kvp_model_config *p = &m.cfg;
    enum { N = 40, CTX = 48, SINKS = 4 };
    int toks[N];
    for (int i = 0; i < N; i++)
        toks[i] = (i * 37 + 11) % p->vocab_size;
    kvp_runstate s;
    kvp_cache c, r;
    cr_assert_eq(kvp_runstate_init(&s, p, N), 0);
    cr_assert_eq(kvp_cache_init(&c, p->n_layers, p->n_kv_heads, p->head_dim, &p->rope), 0);
    cr_assert_eq(kvp_forward(&m, &s, &c, toks, N, NULL), 0);
    void *buf;
    size_t len;
    cr_assert_eq(kvp_cache_serialize(&c, &buf, &len), 0);
    cr_assert_eq(kvp_cache_deserialize(&r, buf, len, err, sizeof err), 0, "%s", err);
    free(buf);
    cr_expect(!c.factors_swa == !r.factors_swa, "the snapshot keeps the windows' own factors");
    float *key = malloc(p->n_layers * (size_t)p->n_kv_heads * p->head_dim * sizeof(float));
    for (int pass = 0; pass < 2; pass++) {
        kvp_cache *cc = pass ? &r : &c;
        kvp_cache_shift(cc, SINKS, CTX);
        cr_assert_eq(cc->shifts, 1);
        int moved = 0;
        for (int kvh = 0; kvh < p->n_kv_heads; kvh++) {
            const kvp_head *h = kvp_cache_head(cc, 0, kvh);
            for (int row = 0; row < h->n; row++) {
                moved += h->pos[row] != (int)h->seq[row];
                keys_at(&m, toks[h->seq[row]], h->pos[row], key);
                const float *want = key + (size_t)kvh * p->head_dim;
                const float *got = (const float *)h->k + (size_t)row * p->head_dim;
                float top, d = max_diff(got, want, p->head_dim, &top);
                cr_assert_leq(d, 1e-5f * top, "%s (%s): head %d row %d now at %d: off by %g",
                              name, pass ? "restored" : "live", kvh, row, h->pos[row], d);
            }
        }
        cr_expect_gt(moved, 0);
    }
    free(key);
    kvp_cache_free(&r);
    kvp_cache_free(&c);
    kvp_runstate_free(&s);
    kvp_model_free(&m);
}

/* llama: layer 0 is scaled (no type key: linear, as llama.cpp reads it); gemma3: layer 0
 * is a sliding-window layer, shifted with its own unscaled factors */
Test(rope_scaling, shift_and_snapshot_scaled_layer) { check_shift("llama-plain", 4.0f); }
Test(rope_scaling, shift_and_snapshot_unscaled_window_layer) { check_shift("gemma3-swa", 8.0f); }

Test(rope_scaling, factor_one_or_type_none_changes_nothing)
{
    kvp_model m;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, scaled("llama-plain", "none", 8.0f), NULL, err, sizeof err),
                 0, "%s", err);
    cr_expect_null(m.cfg.rope.factors, "type none: the factor is not applied");
    kvp_model_free(&m);
    cr_assert_eq(kvp_model_load(&m, scaled("gemma3-swa", "linear", 1.0f), NULL, err, sizeof err),
                 0, "%s", err);
    cr_expect(!m.cfg.rope.factors && !m.cfg.rope_factors_swa);
    kvp_model_free(&m);
}

static void refused(const char *name, const char *type, float factor, const char *want)
{
    kvp_model m;
    char err[512] = "";
    cr_expect_lt(kvp_model_load(&m, scaled(name, type, factor), NULL, err, sizeof err), 0,
                 "%s %s %g loaded", name, type ? type : "-", factor);
    cr_expect(strstr(err, want), "want \"%s\" in: %s", want, err);
}

Test(rope_scaling, unsupported_types_are_refused_by_name)
{
    refused("llama-plain", "yarn", 4.0f, "llama.rope.scaling.type = \"yarn\" is not supported");
    refused("gemma3-swa", "yarn", 8.0f, "gemma3.rope.scaling.type = \"yarn\"");
    refused("llama-plain", "longrope", -1, "llama.rope.scaling.type = \"longrope\"");
    refused("qwen3-qknorm", "dynamic", -1, "qwen3.rope.scaling.type = \"dynamic\"");
    refused("llama-plain", "linear", -2.0f, "llama.rope.scaling.factor = -2");
    refused("llama-plain", "linear", INFINITY, "llama.rope.scaling.factor = inf");
    refused("phi3", "longrope", 4.0f, "only linear scaling takes a factor");
}

Test(rope_scaling, phi3_longrope_type_loads)
{
    kvp_model m, ref;
    char err[512];
    cr_assert_eq(kvp_model_load(&m, scaled("phi3", "longrope", -1), NULL, err, sizeof err), 0,
                 "%s", err);
    cr_assert_eq(kvp_model_load(&ref, fixture("phi3"), NULL, err, sizeof err), 0, "%s", err);
    cr_expect(kvp_rope_same(&m.cfg.rope, &ref.cfg.rope), "longrope adds no linear factor");
    kvp_model_free(&ref);
    kvp_model_free(&m);
}
