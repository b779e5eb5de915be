#include "model/rope_scaling.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/errors.h"

static int str_is(const kvp_gguf_kv *kv, const char *s)
{
    size_t n = strlen(s);
    return (size_t)kv->val.str.len == n && !memcmp(kv->val.str.ptr, s, n);
}

int kvp_rope_scaling_factor(const kvp_gguf *g, const char *arch, int longrope_ok,
                            float *factor, char *err, size_t errlen)
{
    char key[96];
    *factor = 1.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.type", arch);
    const kvp_gguf_kv *type = kvp_gguf_find(g, key);
    if (type && type->type != KVP_GGUF_STRING)
        return KVP_ERR(-EINVAL, "metadata %s is not a string", key);
    int linear = !type || str_is(type, "linear");
    if (type && !linear && !str_is(type, "none") && !(longrope_ok && str_is(type, "longrope")))
        return KVP_ERR(-EINVAL, "%s = \"%.*s\" is not supported (kvpd implements none, "
                       "linear%s)", key, (int)(type->val.str.len < 64 ? type->val.str.len : 64),
                       type->val.str.ptr, longrope_ok ? ", longrope" : "");
    float f = 0.0f;
    snprintf(key, sizeof key, "%s.rope.scaling.factor", arch);
    int rc = kvp_gguf_get_f32(g, key, &f);
    if (rc == -ENOENT) {
        snprintf(key, sizeof key, "%s.rope.scale_linear", arch);
        rc = kvp_gguf_get_f32(g, key, &f);
    }
    if (rc == -ENOENT)
        return 0;
    if (rc)
        return KVP_ERR(-EINVAL, "metadata %s has a wrong type or value", key);
    if (!(f >= 0) || !isfinite(f))
        return KVP_ERR(-EINVAL, "%s = %g: must be a finite number >= 0 (0: none)", key, f);
    /* "none" ignores the factor (as llama.cpp does); LongRoPE with a linear factor on top
     * is not modelled */
    if (f != 0.0f && f != 1.0f && type && str_is(type, "longrope"))
        return KVP_ERR(-EINVAL, "%s = %g with rope.scaling.type \"longrope\": only linear "
                       "scaling takes a factor", key, f);
    if (linear && f != 0.0f)
        *factor = f;
    return 0;
}

float *kvp_rope_scaled_factors(const float *factors, int n, float scale)
{
    float *out = malloc((size_t)(n > 0 ? n : 1) * sizeof *out);
    for (int i = 0; out && i < n; i++)
        out[i] = (factors ? factors[i] : 1.0f) * scale;
    return out;
}
