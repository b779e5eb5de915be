/* Stored Responses are kept per API key (tenant): one key storing many responses drops
 * only its own oldest (max_stored_responses_per_tenant, max_stored_response_bytes_per_tenant),
 * so another key's stored responses stay retrievable and continuable. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(security_response_quota, .timeout = 300);

#define KA "Authorization: Bearer key-a\r\n"
#define KB "Authorization: Bearer key-b\r\n"

/* A request's status; the body as JSON into *out when out is not NULL. */
static int call(const kvpd_proc *d, const char *method, const char *path, const char *headers,
                const char *body, json_t **out)
{
    char *raw = NULL;
    const char *rb = NULL;
    int status = h_request(d->port, method, path, headers, body, &raw, &rb);
    if (out)
        *out = rb ? json_loads(rb, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    free(raw);
    return status;
}

/* Stores a one-token response under headers (continuing prev when not NULL); its id. */
static void store(const kvpd_proc *d, const char *headers, const char *input, const char *prev,
                  char id[64])
{
    char body[2048];
    if (prev)
        snprintf(body, sizeof body, "{\"input\":\"%s\",\"max_output_tokens\":1,"
                 "\"previous_response_id\":\"%.64s\"}", input, prev);
    else
        snprintf(body, sizeof body, "{\"input\":\"%s\",\"max_output_tokens\":1}", input);
    json_t *j;
    int status = call(d, "POST", "/v1/responses", headers, body, &j);
    cr_assert_eq(status, 200, "%s: %d", body, status);
    const char *s = json_string_value(json_object_get(j, "id"));
    cr_assert(s, "no id");
    snprintf(id, 64, "%s", s);
    json_decref(j);
}

static int get(const kvpd_proc *d, const char *headers, const char *id)
{
    char path[128];
    snprintf(path, sizeof path, "/v1/responses/%.64s", id);
    return call(d, "GET", path, headers, "", NULL);
}

/* A's response is still there and its conversation goes on from it, in the same session
 * (its earlier tokens cached). */
static void a_continues(const kvpd_proc *d, const char *id)
{
    cr_assert_eq(get(d, KA, id), 200, "A's stored response was dropped by B's");
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"Then?\",\"max_output_tokens\":1,"
             "\"previous_response_id\":\"%.64s\"}", id);
    json_t *j;
    cr_assert_eq(call(d, "POST", "/v1/responses", KA, body, &j), 200, "A could not continue");
    json_int_t cached = json_integer_value(json_object_get(json_object_get(
        json_object_get(j, "usage"), "input_tokens_details"), "cached_tokens"));
    cr_assert_gt(cached, 0, "A's continuation found nothing cached");
    json_decref(j);
}

/* With the defaults (1024 per key), B storing 1025 responses would have dropped every
 * response of A's from one shared pool. */
Test(security_response_quota, by_default_a_flood_of_one_keys_responses_keeps_the_others)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key key-a,key-b --max-tokens 4"), 0, "log %s", d.log);
    char a[64], b[64];
    store(&d, KA, "Once upon a time", NULL, a);
    for (int i = 0; i < 1025; i++)
        store(&d, KB, "x", NULL, b);
    a_continues(&d, a);
    cr_assert_eq(get(&d, KB, b), 200, "B's newest response is gone");
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_response_quota, a_key_over_its_count_drops_its_own_oldest_first)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key key-a,key-b --max-tokens 4 "
                                "--max-stored-responses-per-tenant 3"), 0, "log %s", d.log);
    char a[64], b[6][64];
    store(&d, KA, "Once upon a time", NULL, a);
    for (int i = 0; i < 6; i++)
        store(&d, KB, "x", NULL, b[i]);
    /* B's three oldest went, oldest first; its three newest stay */
    for (int i = 0; i < 6; i++)
        cr_expect_eq(get(&d, KB, b[i]), i < 3 ? 404 : 200, "B's response %d", i);
    a_continues(&d, a);
    /* A's own continuation is a stored response of A's: A now holds two; a chain of three
     * more drops A's two oldest, and B's stay */
    char c[3][64];
    store(&d, KA, "More", NULL, c[0]);
    store(&d, KA, "More", c[0], c[1]);
    store(&d, KA, "More", c[1], c[2]);
    cr_expect_eq(get(&d, KA, a), 404, "A's oldest was kept past its bound");
    for (int i = 0; i < 3; i++)
        cr_expect_eq(get(&d, KA, c[i]), 200, "A's response %d", i);
    for (int i = 3; i < 6; i++)
        cr_expect_eq(get(&d, KB, b[i]), 200, "A's responses dropped B's %d", i);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* The bytes bound: a key storing past it drops its own oldest, the newest stays, and the
 * other key's response is untouched. */
Test(security_response_quota, a_key_over_its_bytes_drops_its_own_oldest)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key key-a,key-b --max-tokens 4 "
                                "--max-stored-response-bytes-per-tenant 64k"), 0, "log %s", d.log);
    char a[64], first[64], b[64];
    store(&d, KA, "Once upon a time", NULL, a);
    /* inputs of 300 bytes: 64k holds well under 250 of them */
    char input[320] = "";
    for (int i = 0; i < 25; i++)
        strcat(input, "A cat sat. ");
    for (int i = 0; i < 250; i++)
        store(&d, KB, input, NULL, i ? b : first);
    cr_expect_eq(get(&d, KB, first), 404, "B's oldest was kept past its bytes");
    cr_expect_eq(get(&d, KB, b), 200, "B's newest is gone");
    a_continues(&d, a);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_response_quota, bad_bounds_are_refused_naming_the_setting)
{
    static const struct { const char *arg, *name; } bad[] = {
        {"--max-stored-responses-per-tenant 0", "max_stored_responses_per_tenant"},
        {"--max-stored-responses-per-tenant lots", "max_stored_responses_per_tenant"},
        {"--max-stored-response-bytes-per-tenant 1k", "max_stored_response_bytes_per_tenant"},
        {"--max-stored-response-bytes-per-tenant 1.5M", "max_stored_response_bytes_per_tenant"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        kvpd_proc d;
        if (kvpd_spawn(&d, bad[i].arg) == 0) {
            int rc = kvpd_wait(&d, 20000);
            cr_assert_neq(rc, 0, "started with %s", bad[i].arg);
        }
        char dashed[64];
        snprintf(dashed, sizeof dashed, "%s", bad[i].name);
        for (char *p = dashed; *p; p++)
            if (*p == '_')
                *p = '-';
        cr_assert(kvpd_log_has(&d, bad[i].name) || kvpd_log_has(&d, dashed), "%s: log %s",
                  bad[i].arg, d.log);
        unlink(d.log);
    }
}
