/* A model file from untrusted bytes: kvp_model_load (GGUF or llama2.c, shapes, vocabulary,
 * template), then, when it loads, a two-token prefill and one decode step, so that a
 * shape the loader let through is also one the forward pass can run. */
#include <stdio.h>
#include <sys/mman.h>
#include <unistd.h>

#include "base/fileio.h"
#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/model.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    int fd = memfd_create("fuzz-model.gguf", 0);
    if (fd < 0)
        return 0;
    if (kvp_write_all(fd, data, size) < 0) {
        close(fd);
        return 0;
    }
    char path[64], err[256];
    snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
    kvp_model m;
    /* a tokenizer beside a llama2.c checkpoint is looked up by name; none exists here */
    if (kvp_model_load(&m, path, NULL, err, sizeof err) == 0) {
        const kvp_model_config *c = &m.cfg;
        kvp_cache cache;
        kvp_runstate rs;
        /* only small shapes run (a mutated header can claim a huge one: the loader
         * checks it against the file's bytes, which bounds it already) */
        if ((long)c->dim * c->n_layers <= (1L << 16) && c->vocab_size <= (1 << 16) &&
            kvp_cache_init(&cache, c->n_layers, c->n_kv_heads, c->head_dim, &c->rope) == 0) {
            if (kvp_runstate_init(&rs, c, 2) == 0) {
                int tokens[2] = {0, c->vocab_size - 1};
                if (kvp_forward(&m, &rs, &cache, tokens, 2, NULL) == 0)
                    kvp_forward(&m, &rs, &cache, tokens, 1, NULL);
                kvp_runstate_free(&rs);
            }
            kvp_cache_free(&cache);
        }
        kvp_model_free(&m);
    }
    close(fd);
    return 0;
}
