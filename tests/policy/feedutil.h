/* The policy tests' small world: a 2-layer, 2-KV-head model shape and feed(), which puts
 * one token into every head of a cache as the forward pass does (row, on_insert, then the
 * query's attention), all deterministic from the token's seq. */
#ifndef KVP_TESTS_POLICY_FEEDUTIL_H
#define KVP_TESTS_POLICY_FEEDUTIL_H

#include <criterion/criterion.h>
#include <math.h>

#include "policy/policy.h"


#define D 4
#define LAYERS 2
#define KVH 2
#define GROUP 2
#define FEED_ROWS 160   /* rows a head may hold while fed (its attention rows' stride) */

static const kvp_rope ROPE = {.n_rot = D, .base = 10000.0f};

static kvp_model_config cfg(void)
{
    return (kvp_model_config){.dim = 16, .hidden_dim = 32, .n_layers = LAYERS,
                              .n_heads = KVH * GROUP, .n_kv_heads = KVH, .head_dim = D,
                              .vocab_size = 32, .seq_len = 4096, .rope = ROPE, .rms_eps = 1e-5f};
}

static float val(int64_t seq, int salt)
{
    return sinf((float)(seq * 7 + salt) * 0.37f);
}

/* One token into every head: its row (key from its seq), on_insert, then its query's
 * attention over the head's rows (deterministic from seq), as the forward pass does. */
static void feed(kvp_policy *p, kvp_cache *c)
{
    int64_t s = c->n_seen;
    for (int l = 0; l < LAYERS; l++)
        for (int k = 0; k < KVH; k++) {
            kvp_head *h = kvp_cache_head(c, l, k);
            cr_assert_eq(kvp_head_reserve(h, D, h->n + 1), 0);
            int r = h->n++;
            for (int j = 0; j < D; j++) {
                ((float *)h->k)[(size_t)r * D + j] = val(s, j);
                ((float *)h->v)[(size_t)r * D + j] = val(s, j + 9);
            }
            h->pos[r] = (int32_t)s;
            h->seq[r] = s;
            h->score[r] = h->stat[r] = 0.0f;
            if (p->ops->on_insert)
                p->ops->on_insert(p, l, k, h, r, 1);
            float q[GROUP * D], att[GROUP * FEED_ROWS];
            cr_assert(h->n <= FEED_ROWS);
            for (int g = 0; g < GROUP; g++) {
                float sum = 0.0f;
                for (int j = 0; j < D; j++)
                    q[g * D + j] = val(s, 20 + g * D + j + l + k);
                for (int i = 0; i < h->n; i++)
                    sum += att[g * FEED_ROWS + i] = 1.0f + val(s + i, g + l * 3 + k);
                for (int i = 0; i < h->n; i++)
                    att[g * FEED_ROWS + i] /= sum;
            }
            if (p->ops->on_attention)
                p->ops->on_attention(p, l, k, h, q, GROUP * D, att, FEED_ROWS, 1);
        }
    c->n_seen++;
    c->next_pos++;
}

#endif
