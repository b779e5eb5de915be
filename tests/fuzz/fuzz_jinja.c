/* A chat template and its variables from untrusted bytes (model/jinja.h): the template
 * text, then optionally a NUL and a JSON object whose members become the variables
 * (messages, tools, add_generation_prompt, ...). Without one (or when it is not a JSON
 * object) the template gets a small conversation. Limits are tighter than the daemon's
 * so that each input runs fast; they bound the same code paths. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "model/jinja.h"
#include "model/jinja_json.h"
#include "tests/fuzz/fuzz.h"

static kvp_jv *default_vars(kvp_jarena *a)
{
    kvp_jv *vars = kvp_jv_dict(a), *msgs = kvp_jv_list(a);
    static const char *turns[][2] = {{"system", "Be brief."}, {"user", "<|im_start|>hi"},
                                     {"assistant", "Hello."}, {"user", "Thanks — 日本"}};
    for (size_t i = 0; i < sizeof turns / sizeof *turns; i++) {
        kvp_jv *m = kvp_jv_dict(a);
        kvp_jv_set(a, m, "role", kvp_jv_str(a, turns[i][0], strlen(turns[i][0])));
        kvp_jv_set(a, m, "content", kvp_jv_str(a, turns[i][1], strlen(turns[i][1])));
        kvp_jv_append(a, msgs, m);
    }
    kvp_jv_set(a, vars, "messages", msgs);
    kvp_jv_set(a, vars, "add_generation_prompt", kvp_jv_bool(a, 1));
    return vars;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const char *src = (const char *)data;
    const char *nul = memchr(src, 0, size);
    size_t tlen = nul ? (size_t)(nul - src) : size;
    char err[256];
    kvp_jinja *t = kvp_jinja_parse(src, tlen, err, sizeof err);
    if (!t)
        return 0;
    kvp_jarena *a = kvp_jarena_new((size_t)16 << 20);
    kvp_jv *vars = NULL;
    if (nul) {
        json_t *j = json_loadb(nul + 1, size - tlen - 1, JSON_DECODE_ANY | JSON_ALLOW_NUL, NULL);
        if (json_is_object(j))
            vars = kvp_jv_from_json(a, j);
        json_decref(j);
    }
    if (!vars)
        vars = default_vars(a);
    kvp_jv_set(a, vars, "bos_token", kvp_jv_str_trusted(a, "<s>", 3));
    kvp_jv_set(a, vars, "eos_token", kvp_jv_str_trusted(a, "</s>", 4));
    kvp_jinja_limits lim = {.max_output = 1 << 16, .max_steps = 20000, .max_depth = 32};
    char *out = NULL;
    unsigned char *mask = NULL;
    long n = kvp_jinja_render(t, a, vars, &lim, &out, &mask, err, sizeof err);
    if (n >= 0 && (out[n] != 0 || (size_t)n > lim.max_output))
        abort();                        /* the output is NUL-terminated and bounded */
    for (long i = 0; n > 0 && i < n; i++)
        if (mask[i] > 1)
            abort();
    free(out);
    free(mask);
    kvp_jarena_free(a);
    kvp_jinja_free(t);
    return 0;
}
