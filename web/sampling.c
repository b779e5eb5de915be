/* Sampling fields of a request: one reading for the websocket and the OpenAI API. */
#include "web/sampling.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"

static int bad(const char **param, const char *name, char *msg, size_t msglen, const char *why)
{
    *param = name;
    snprintf(msg, msglen, "%s %s", name, why);
    return -EINVAL;
}

/* A number field in [lo, hi]; absent or null: *has 0. */
static int number(json_t *req, const char *name, double lo, double hi, int *has, double *out,
                  const char **param, char *msg, size_t msglen)
{
    json_t *v = json_object_get(req, name);
    *has = 0;
    *out = 0;
    if (!v || json_is_null(v))
        return 0;
    if (!json_is_number(v) || !(json_number_value(v) >= lo && json_number_value(v) <= hi)) {
        *param = name;
        snprintf(msg, msglen, "%s must be a number from %g to %g", name, lo, hi);
        return -EINVAL;
    }
    *has = 1;
    *out = json_number_value(v);
    return 0;
}

static int bias(json_t *req, kvpd_sampling *own, kvp_sample_opts *so, const char **param,
                char *msg, size_t msglen)
{
    json_t *lb = json_object_get(req, "logit_bias");
    if (!lb || json_is_null(lb))
        return 0;
    if (!json_is_object(lb) || json_object_size(lb) > KVP_SAMPLER_MAX_BIAS) {
        *param = "logit_bias";
        snprintf(msg, msglen, "logit_bias must be an object of at most %d token ids, each "
                 "mapped to a number from -100 to 100", KVP_SAMPLER_MAX_BIAS);
        return -EINVAL;
    }
    free(own->bias);
    own->bias = NULL;
    size_t n = json_object_size(lb);
    if (n && !(own->bias = malloc(n * sizeof *own->bias)))
        return -ENOMEM;
    const char *key;
    json_t *v;
    int k = 0;
    json_object_foreach(lb, key, v) {
        long id;
        if (!kvp_parse_long(key, 0, 1L << 30, &id) || !json_is_number(v) ||
            !(json_number_value(v) >= -100 && json_number_value(v) <= 100)) {
            *param = "logit_bias";
            snprintf(msg, msglen, "logit_bias: \"%.64s\" must be a token id mapped to a number "
                     "from -100 to 100", key);
            return -EINVAL;
        }
        own->bias[k++] = (kvp_logit_bias){(int)id, (float)json_number_value(v)};
    }
    so->bias = own->bias;
    so->n_bias = k;
    return 0;
}

static int stops(json_t *req, kvpd_sampling *own, kvp_turn_opts *t, const char **param,
                 char *msg, size_t msglen)
{
    json_t *stop = json_object_get(req, "stop");
    if (!stop || json_is_null(stop))
        return 0;
    size_t n = json_is_string(stop) ? 1 : json_is_array(stop) ? json_array_size(stop) : 0;
    int ok = (json_is_string(stop) || json_is_array(stop)) && n <= KVP_HUB_MAX_STOPS;
    for (size_t i = 0; ok && i < n; i++) {
        json_t *s = json_is_string(stop) ? stop : json_array_get(stop, i);
        ok = json_is_string(s) && json_string_length(s) > 0 &&
             json_string_length(s) <= KVP_HUB_STOP_MAX;
    }
    if (!ok) {
        *param = "stop";
        snprintf(msg, msglen, "stop must be a string or up to %d strings of 1 to %d bytes",
                 KVP_HUB_MAX_STOPS, KVP_HUB_STOP_MAX);
        return -EINVAL;
    }
    for (int i = 0; i < own->n_stops; i++)
        free(own->stops[i]);
    own->n_stops = 0;
    t->n_stop = 0;
    for (size_t i = 0; i < n; i++) {
        json_t *s = json_is_string(stop) ? stop : json_array_get(stop, i);
        size_t len = json_string_length(s);
        if (!(own->stops[own->n_stops] = malloc(len)))
            return -ENOMEM;
        memcpy(own->stops[own->n_stops], json_string_value(s), len);
        t->stop[own->n_stops] = own->stops[own->n_stops];
        t->stop_len[own->n_stops] = len;
        t->n_stop = ++own->n_stops;
    }
    return 0;
}

int kvpd_sampling_parse(json_t *req, double temperature_max, kvpd_sampling *own,
                        kvp_turn_opts *t, const char **param, char *msg, size_t msglen)
{
    *param = NULL;
    int has, rc;
    double v;
    if ((rc = number(req, "temperature", 0, temperature_max, &t->has_temperature, &v, param,
                     msg, msglen)) < 0)
        return rc;
    t->temperature = (float)v;
    if ((rc = number(req, "top_p", 0, 1, &t->has_top_p, &v, param, msg, msglen)) < 0)
        return rc;
    t->top_p = (float)v;
    /* OpenAI's penalties; top_k, min_p and repetition_penalty as llama.cpp's and vLLM's
     * servers take them */
    static const char *const name[] = {"frequency_penalty", "presence_penalty", "min_p",
                                       "repetition_penalty"};
    static const double lo[] = {-2, -2, 0, 0}, hi[] = {2, 2, 1, 10};
    float *out[] = {&t->sampling.frequency_penalty, &t->sampling.presence_penalty,
                    &t->sampling.min_p, &t->sampling.repetition_penalty};
    for (int i = 0; i < 4; i++) {
        if ((rc = number(req, name[i], lo[i], hi[i], &has, &v, param, msg, msglen)) < 0)
            return rc;
        if (has && i == 3 && v <= 0)
            return bad(param, name[i], msg, msglen, "must be above 0");
        *out[i] = (float)v;
    }
    if ((rc = number(req, "top_k", 0, 1e9, &has, &v, param, msg, msglen)) < 0)
        return rc;
    if (has && v != (double)(long)v)
        return bad(param, "top_k", msg, msglen, "must be an integer");
    t->sampling.top_k = (int)v;
    json_t *seed = json_object_get(req, "seed");
    if (seed && !json_is_null(seed)) {
        if (!json_is_integer(seed))
            return bad(param, "seed", msg, msglen, "must be an integer");
        t->has_seed = 1;
        t->seed = (uint64_t)json_integer_value(seed);
    }
    if ((rc = bias(req, own, &t->sampling, param, msg, msglen)) < 0 ||
        (rc = stops(req, own, t, param, msg, msglen)) < 0) {
        if (rc == -ENOMEM) {
            *param = NULL;
            snprintf(msg, msglen, "out of memory");
        }
        return rc;
    }
    return 0;
}

const char *const kvpd_sampling_fields[] = {"temperature", "top_p", "frequency_penalty",
                                            "presence_penalty", "min_p", "repetition_penalty",
                                            "top_k", "seed", "logit_bias", "stop", NULL};

void kvpd_sampling_free(kvpd_sampling *own)
{
    free(own->bias);
    for (int i = 0; i < own->n_stops; i++)
        free(own->stops[i]);
    memset(own, 0, sizeof *own);
}
