/* A one-shot API session whose snapshot write failed is written again with backoff:
 * /healthz leaves 503 "degraded" by itself once writes succeed, and the API answer says
 * whether its turn is durable (the kvpd object and an X-Kvpd-Durable header). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

static char g_dir[128];

static void setup(void)
{
    cr_assert_eq(h_mkdtemp(g_dir, sizeof g_dir), 0);
}

static void teardown(void)
{
    h_rmdir(g_dir);
}

TestSuite(security_save_retry, .init = setup, .fini = teardown, .timeout = 90);

Test(security_save_retry, a_failed_api_save_is_retried_and_health_recovers)
{
    kvpd_proc p;
    char args[256];
    snprintf(args, sizeof args, "--state-dir %s", g_dir);
    cr_assert_eq(kvpd_start(&p, args), 0, "log %s", p.log);
    char *raw = NULL;
    json_t *a = h_complete(&p, "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a "
                             "time\"}],\"max_tokens\":4}", &raw);
    cr_assert(json_is_true(json_object_get(json_object_get(a, "kvpd"), "durable")), "%s", raw);
    cr_assert_str_eq(h_header(raw, "x-kvpd-durable:"), "true", "%s", raw);
    char id[64];
    snprintf(id, sizeof id, "%s", h_header(raw, "x-session-id:"));
    cr_assert(id[0], "%s", raw);
    free(raw);
    /* Its next writes fail: directories squat where they go. */
    char squat[512], path[600];
    snprintf(squat, sizeof squat, "%s/%s", g_dir, id);
    snprintf(path, sizeof path, "%s.snap.tmp", squat);
    cr_assert_eq(mkdir(path, 0700), 0);
    snprintf(path, sizeof path, "%s.journal", squat);
    unlink(path);
    cr_assert_eq(mkdir(path, 0700), 0);
    char *body = h_second_turn("Once upon a time", h_reply_of(a), "The dog ran.", 4, NULL);
    json_decref(a);
    json_t *b = h_complete(&p, body, &raw);
    free(body);
    /* continued, found by its transcript: cached, and no id answered (a new session would
     * name its own) */
    cr_assert(!h_header(raw, "x-session-id:")[0] &&
              json_integer_value(json_object_get(json_object_get(json_object_get(b, "usage"),
                  "prompt_tokens_details"), "cached_tokens")) > 0,
              "the conversation was not continued: %s", raw);
    cr_assert(json_is_false(json_object_get(json_object_get(b, "kvpd"), "durable")), "%s", raw);
    cr_assert_str_eq(h_header(raw, "x-kvpd-durable:"), "false", "%s", raw);
    json_decref(b);
    free(raw);
    char *hb = NULL;
    cr_assert_eq(h_get(&p, "/healthz", NULL, &hb), 503, "%s", hb);
    free(hb);
    /* The disk comes back; no client does anything: a retry writes the session. */
    snprintf(path, sizeof path, "%s.snap.tmp", squat);
    cr_assert_eq(rmdir(path), 0);
    snprintf(path, sizeof path, "%s.journal", squat);
    cr_assert_eq(rmdir(path), 0);
    int st = 0;
    for (int i = 0; i < 100; i++) {
        hb = NULL;
        st = h_get(&p, "/healthz", NULL, &hb);
        free(hb);
        if (st == 200)
            break;
        nanosleep(&(struct timespec){0, 100 * 1000 * 1000}, NULL);
    }
    cr_assert_eq(st, 200, "/healthz stayed degraded after writes succeed again (log %s)", p.log);
    cr_assert(kvpd_log_has(&p, "written on retry"), "log %s", p.log);
    cr_assert_eq(kvpd_stop(&p, 10000), 0, "the session was not on disk at shutdown");
}

Test(security_save_retry, without_a_state_dir_the_answer_makes_no_durability_claim)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char *raw = NULL;
    json_t *a = h_complete(&p, "{\"messages\":[{\"role\":\"user\",\"content\":\"Once\"}],"
                             "\"max_tokens\":2}", &raw);
    json_t *k = json_object_get(a, "kvpd");
    cr_assert(json_object_get(k, "durable") && json_is_null(json_object_get(k, "durable")),
              "%s", raw);
    cr_assert_str_eq(h_header(raw, "x-kvpd-durable:"), "", "%s", raw);
    json_decref(a);
    free(raw);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}
