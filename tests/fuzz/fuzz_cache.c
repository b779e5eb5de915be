/* A serialized KV cache (the blob inside a snapshot) from untrusted bytes: restored, then
 * every head's rows read back as f32 and converted to each row type. */
#include <stdlib.h>

#include "cache/kvcache.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_cache c;
    char err[256];
    if (kvp_cache_deserialize(&c, data, size, err, sizeof err) != 0)
        return 0;
    float *tmp = NULL;
    for (int i = 0; i < c.n_layers * c.n_kv_heads; i++) {
        const kvp_head *h = &c.heads[i];
        float *more = realloc(tmp, (size_t)(h->n ? h->n : 1) * c.head_dim * sizeof *tmp);
        if (!more)
            break;
        tmp = more;
        kvp_head_keys(h, c.head_dim, 0, h->n, tmp);
        kvp_head_values(h, c.head_dim, 0, h->n, tmp);
    }
    free(tmp);
    kvp_cache_convert(&c, KVP_KV_Q8_0);
    kvp_cache_convert(&c, KVP_KV_F16);
    kvp_cache_free(&c);
    return 0;
}
