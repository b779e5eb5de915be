/* GGUF from untrusted bytes: the parser, then every tensor and key the loaders read. */
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "tests/fuzz/fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvp_gguf g;
    char err[256];
    if (kvp_gguf_parse(&g, data, size, err, sizeof err) != 0)
        return 0;
    uint32_t u;
    float f;
    char s[128];
    static const char *keys[] = {"general.architecture", "llama.context_length",
                                 "llama.embedding_length", "tokenizer.ggml.model"};
    for (size_t i = 0; i < sizeof keys / sizeof keys[0]; i++) {
        kvp_gguf_get_u32(&g, keys[i], &u);
        kvp_gguf_get_f32(&g, keys[i], &f);
        kvp_gguf_get_str(&g, keys[i], s, sizeof s);
    }
    const kvp_gguf_kv *kv = kvp_gguf_find(&g, "tokenizer.ggml.tokens");
    if (kv) {
        kvp_gguf_str strs[64];
        kvp_gguf_str_array(kv, strs, 64);
    }
    kvp_gguf_find_tensor(&g, "token_embd.weight");
    kvp_gguf_close(&g);
    return 0;
}
