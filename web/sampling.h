/* A turn's sampling fields, read from a JSON request the same way for the /chat
 * websocket's `message` and the OpenAI API: temperature, top_p, top_k, min_p,
 * frequency_penalty, presence_penalty, repetition_penalty, logit_bias, seed and stop.
 * No libwebsockets here. */
#ifndef KVPD_SAMPLING_H
#define KVPD_SAMPLING_H

#include <jansson.h>
#include <stddef.h>

#include "model/sampler.h"
#include "sessions/hub.h"

/* What the parsed fields own: the logit biases and the stop strings the turn's options
 * point at. Zero it before the first parse; free it after the turn has been handed to
 * the hub (which copies what it keeps). */
typedef struct kvpd_sampling {
    kvp_logit_bias *bias;
    char *stops[KVP_HUB_MAX_STOPS];
    int n_stops;
} kvpd_sampling;

/* Reads the fields above from the object req into t (absent or null: not set, so the
 * configured default applies); temperature is taken in [0, temperature_max] (the API
 * says 2; the websocket allows 10). Returns 0, or -EINVAL with *param naming the field
 * and msg its reason (nothing of req is kept), or -ENOMEM (param NULL). Fields other
 * than these are left for the caller. */
int kvpd_sampling_parse(json_t *req, double temperature_max, kvpd_sampling *own,
                        kvp_turn_opts *t, const char **param, char *msg, size_t msglen);
void kvpd_sampling_free(kvpd_sampling *own);
/* The names of the fields kvpd_sampling_parse reads, NULL-terminated: the requests'
 * lists of known fields take them from here. */
extern const char *const kvpd_sampling_fields[];

#endif
