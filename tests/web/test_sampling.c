/* web/sampling.c: a request's sampling fields read into a turn's options, each field's
 * range enforced with the field named, and the biases and stop strings owned until freed. */
#include <criterion/criterion.h>
#include <errno.h>
#include <string.h>

#include "web/sampling.h"

typedef struct parsed {
    kvpd_sampling own;
    kvp_turn_opts t;
    const char *param;
    char msg[256];
    int rc;
} parsed;

static void parse(parsed *p, const char *body, double temperature_max)
{
    memset(p, 0, sizeof *p);
    json_error_t e;
    json_t *req = json_loads(body, 0, &e);
    cr_assert(req, "%s: %s", body, e.text);
    p->rc = kvpd_sampling_parse(req, temperature_max, &p->own, &p->t, &p->param, p->msg,
                                sizeof p->msg);
    json_decref(req);     /* nothing of the request may be kept */
}

/* body is refused naming field, with want in the message. */
static void refused(const char *body, const char *field, const char *want)
{
    parsed p;
    parse(&p, body, 2);
    cr_assert_eq(p.rc, -EINVAL, "%s was accepted", body);
    cr_assert_str_eq(p.param, field, "%s", body);
    cr_assert(strstr(p.msg, want), "%s: wanted \"%s\" in \"%s\"", body, want, p.msg);
    kvpd_sampling_free(&p.own);
}

Test(sampling, absent_and_null_fields_are_not_set)
{
    parsed p;
    parse(&p, "{\"temperature\":null,\"top_p\":null,\"seed\":null,\"stop\":null,"
              "\"logit_bias\":null,\"model\":\"x\"}", 2);
    cr_assert_eq(p.rc, 0, "%s", p.msg);
    cr_assert_null(p.param);
    cr_assert_eq(p.t.has_temperature, 0);
    cr_assert_eq(p.t.has_top_p, 0);
    cr_assert_eq(p.t.has_seed, 0);
    cr_assert_eq(p.t.n_stop, 0);
    cr_assert_eq(p.t.sampling.n_bias, 0);
    cr_assert_eq(p.t.sampling.top_k, 0);
    kvpd_sampling_free(&p.own);
}

Test(sampling, every_field_is_read)
{
    parsed p;
    parse(&p, "{\"temperature\":0.7,\"top_p\":0.9,\"top_k\":40,\"min_p\":0.05,"
              "\"frequency_penalty\":-1.5,\"presence_penalty\":2,\"repetition_penalty\":1.1,"
              "\"seed\":12345678901,\"logit_bias\":{\"17\":-100,\"3\":5.5},"
              "\"stop\":[\"\\n\\n\",\"END\"]}", 2);
    cr_assert_eq(p.rc, 0, "%s", p.msg);
    cr_assert(p.t.has_temperature);
    cr_assert_float_eq(p.t.temperature, 0.7f, 1e-6);
    cr_assert(p.t.has_top_p);
    cr_assert_float_eq(p.t.top_p, 0.9f, 1e-6);
    cr_assert_eq(p.t.sampling.top_k, 40);
    cr_assert_float_eq(p.t.sampling.min_p, 0.05f, 1e-6);
    cr_assert_float_eq(p.t.sampling.frequency_penalty, -1.5f, 1e-6);
    cr_assert_float_eq(p.t.sampling.presence_penalty, 2.0f, 1e-6);
    cr_assert_float_eq(p.t.sampling.repetition_penalty, 1.1f, 1e-6);
    cr_assert(p.t.has_seed);
    cr_assert_eq(p.t.seed, 12345678901ull);
    cr_assert_eq(p.t.sampling.n_bias, 2);
    cr_assert_eq(p.t.sampling.bias, p.own.bias, "the biases are owned by own");
    int seen17 = 0, seen3 = 0;
    for (int i = 0; i < 2; i++) {
        if (p.t.sampling.bias[i].token == 17 && p.t.sampling.bias[i].bias == -100.0f)
            seen17 = 1;
        if (p.t.sampling.bias[i].token == 3 && p.t.sampling.bias[i].bias == 5.5f)
            seen3 = 1;
    }
    cr_assert(seen17 && seen3);
    cr_assert_eq(p.t.n_stop, 2);
    cr_assert_eq(p.t.stop_len[0], 2);
    cr_assert_eq(memcmp(p.t.stop[0], "\n\n", 2), 0);
    cr_assert_eq(p.t.stop_len[1], 3);
    cr_assert_eq(memcmp(p.t.stop[1], "END", 3), 0);
    cr_assert_eq(p.t.stop[1], p.own.stops[1]);
    kvpd_sampling_free(&p.own);
    cr_assert_null(p.own.bias);
    cr_assert_eq(p.own.n_stops, 0);
}

Test(sampling, one_stop_string_and_ranges_at_their_ends)
{
    parsed p;
    parse(&p, "{\"stop\":\"###\",\"temperature\":0,\"top_p\":1,\"min_p\":1,"
              "\"repetition_penalty\":10,\"top_k\":0}", 2);
    cr_assert_eq(p.rc, 0, "%s", p.msg);
    cr_assert_eq(p.t.n_stop, 1);
    cr_assert_eq(p.t.stop_len[0], 3);
    cr_assert(p.t.has_temperature);
    cr_assert_eq(p.t.temperature, 0.0f);
    cr_assert_eq(p.t.sampling.repetition_penalty, 10.0f);
    kvpd_sampling_free(&p.own);
    /* the websocket's larger temperature bound */
    parse(&p, "{\"temperature\":7.5}", 10);
    cr_assert_eq(p.rc, 0, "%s", p.msg);
    cr_assert_float_eq(p.t.temperature, 7.5f, 1e-6);
    kvpd_sampling_free(&p.own);
}

Test(sampling, out_of_range_fields_are_named)
{
    refused("{\"temperature\":2.01}", "temperature", "from 0 to 2");
    refused("{\"temperature\":-0.1}", "temperature", "from 0 to 2");
    refused("{\"temperature\":\"1\"}", "temperature", "must be a number");
    refused("{\"top_p\":1.5}", "top_p", "from 0 to 1");
    refused("{\"frequency_penalty\":-2.5}", "frequency_penalty", "from -2 to 2");
    refused("{\"presence_penalty\":3}", "presence_penalty", "from -2 to 2");
    refused("{\"min_p\":1.01}", "min_p", "from 0 to 1");
    refused("{\"repetition_penalty\":0}", "repetition_penalty", "must be above 0");
    refused("{\"repetition_penalty\":11}", "repetition_penalty", "from 0 to 10");
    refused("{\"top_k\":2.5}", "top_k", "must be an integer");
    refused("{\"top_k\":-1}", "top_k", "must be a number");
    refused("{\"seed\":1.5}", "seed", "must be an integer");
    refused("{\"seed\":\"7\"}", "seed", "must be an integer");
}

Test(sampling, bad_logit_bias_and_stop_are_named)
{
    refused("{\"logit_bias\":[1]}", "logit_bias", "must be an object");
    refused("{\"logit_bias\":{\"abc\":1}}", "logit_bias", "\"abc\" must be a token id");
    refused("{\"logit_bias\":{\"-1\":1}}", "logit_bias", "\"-1\" must be a token id");
    refused("{\"logit_bias\":{\"5\":101}}", "logit_bias", "\"5\" must be a token id");
    refused("{\"logit_bias\":{\"5\":\"x\"}}", "logit_bias", "\"5\"");
    refused("{\"stop\":\"\"}", "stop", "1 to 256 bytes");
    refused("{\"stop\":7}", "stop", "a string or up to 4 strings");
    refused("{\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", "stop", "up to 4 strings");
    refused("{\"stop\":[\"a\",3]}", "stop", "up to 4 strings");
    char big[400];
    snprintf(big, sizeof big, "{\"stop\":\"%0257d\"}", 0);
    refused(big, "stop", "1 to 256 bytes");
}

/* A second parse into the same own replaces what the first one kept, without a leak. */
Test(sampling, a_second_parse_replaces_the_first)
{
    parsed p;
    parse(&p, "{\"stop\":[\"a\",\"bb\"],\"logit_bias\":{\"1\":1}}", 2);
    cr_assert_eq(p.rc, 0);
    json_t *req = json_loads("{\"stop\":\"ccc\",\"logit_bias\":{\"2\":-1,\"4\":1}}", 0, NULL);
    cr_assert_eq(kvpd_sampling_parse(req, 2, &p.own, &p.t, &p.param, p.msg, sizeof p.msg), 0);
    json_decref(req);
    cr_assert_eq(p.t.n_stop, 1);
    cr_assert_eq(p.own.n_stops, 1);
    cr_assert_eq(memcmp(p.t.stop[0], "ccc", 3), 0);
    cr_assert_eq(p.t.sampling.n_bias, 2);
    kvpd_sampling_free(&p.own);
}
