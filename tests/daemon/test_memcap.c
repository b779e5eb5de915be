/* Integration: the global KV cache cap. 50 sessions under a cap of 10 turns' worth:
 * idle sessions are parked and come back, refused turns carry a retry hint, the bytes
 * the cap counts never pass it, and every session answers every turn. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/daemon/harness.h"

#define SESSIONS 50
#define ROUNDS 3

H_STATE_DIR_SUITE(memcap, .timeout = 120);

static const char *str_of(json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

static json_int_t int_at(json_t *j, const char *obj, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(j, obj), key));
}

static double metric(const kvpd_proc *d, const char *name)
{
    char *body = NULL;
    cr_assert_eq(h_get(d, "/metrics", NULL, &body), 200);
    double v = h_metric(body, name);
    free(body);
    return v;
}

/* Budget of the fifty-session runs: small enough that their three turns evict (with the
 * default KVP policy, global budgets then move rows between heads). */
#define BUDGET "32"

/* The bytes one turn reserves, from a daemon with no cap storing rows as kv_type. */
static json_int_t turn_bytes(const char *kv_type, const char *mode)
{
    kvpd_proc d;
    char args[128];
    snprintf(args, sizeof args, "--kv-type %s --budget-mode %s --budget " BUDGET, kv_type, mode);
    cr_assert_eq(kvpd_start(&d, args), 0);
    json_t *st = h_stats(&d);
    cr_assert(st);
    cr_assert_str_eq(str_of(st, "kv_type"), kv_type);
    cr_assert_str_eq(str_of(st, "budget_mode"), mode);
    cr_assert_str_eq(str_of(st, "policy"), "kvp", "global budgets rank KVP's calibrated scores");
    json_int_t r = int_at(st, "memory", "turn_reserve_bytes");
    json_decref(st);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    cr_assert_gt(r, 0);
    return r;
}

static void send_message(ws_client *c, const char *text)
{
    char msg[256];
    snprintf(msg, sizeof msg, "{\"type\":\"message\",\"text\":\"%s\",\"max_tokens\":8}", text);
    cr_assert_eq(ws_send_text(c, msg), 0);
}

/* The memory the cap counts, and what resident caches hold, are within the cap. */
static void check_cap(const kvpd_proc *d, json_int_t cap)
{
    json_t *st = h_stats(d);
    cr_assert(st);
    json_int_t accounted = int_at(st, "memory", "accounted_bytes");
    json_int_t resident = int_at(st, "memory", "resident_bytes");
    cr_assert_leq(accounted, cap, "accounted %lld > cap %lld", (long long)accounted, (long long)cap);
    cr_assert_leq(resident, cap, "resident %lld > cap %lld", (long long)resident, (long long)cap);
    json_decref(st);
}

/* Fifty sessions under a cap of ten turns' reservations, cache rows stored as kv_type,
 * budgets per head or global. */
static void fifty_sessions_under_a_cap_of_ten(const char *kv_type, const char *mode)
{
    json_int_t per_turn = turn_bytes(kv_type, mode);
    json_int_t cap = 10 * per_turn;
    char args[512];
    /* The fifty conversations say the same lines, so with share_prompts a turn would take
     * its prompt's rows from another of its step: off here, every turn prefills its own new
     * tokens and the count below tells a parked session's re-prefill apart. */
    snprintf(args, sizeof args, "--state-dir %s --max-cache-bytes %lld --max-sessions 100 "
             "--kv-type %s --budget-mode %s --budget " BUDGET " --no-share-prompts", g_dir,
             (long long)cap, kv_type, mode);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);

    static ws_client c[SESSIONS];
    for (int i = 0; i < SESSIONS; i++) {
        cr_assert_eq(h_connect(&d, &c[i]), 0);
        cr_assert_eq(ws_send_text(&c[i], "{\"type\":\"hello\"}"), 0);
        json_t *s = h_expect(&c[i], "session", 5000);
        cr_assert(s, "session %d", i);
        json_decref(s);
    }
    static const char *lines[ROUNDS] = {"Once upon a time, there was a little dog.",
                                        "The dog liked to play in the park.",
                                        "One day, it saw a big red ball."};
    int refused = 0;
    for (int round = 0; round < ROUNDS; round++) {
        /* Everyone at once: more turns than the cap holds. */
        for (int i = 0; i < SESSIONS; i++)
            send_message(&c[i], lines[round]);
        for (int i = 0; i < SESSIONS; i++) {
            for (;;) {
                json_t *j = h_read_json(&c[i], 30000);
                cr_assert(j, "session %d round %d: no answer", i, round);
                const char *t = str_of(j, "type");
                if (!strcmp(t, "token")) {
                    json_decref(j);
                    continue;
                }
                if (!strcmp(t, "error")) {
                    cr_assert_str_eq(str_of(j, "code"), "overloaded", "%s", str_of(j, "message"));
                    json_int_t hint = json_integer_value(json_object_get(j, "retry_after_ms"));
                    cr_assert(hint > 0 && hint <= 5000, "retry hint %lld", (long long)hint);
                    refused++;
                    json_decref(j);
                    check_cap(&d, cap);
                    /* Waiting less than the hint keeps the test short; the daemon
                     * just refuses again until there is room. */
                    nanosleep(&(struct timespec){0, (hint < 10 ? hint : 10) * 1000000L}, NULL);
                    send_message(&c[i], lines[round]);
                    continue;
                }
                cr_assert_str_eq(t, "done");
                json_t *st = json_object_get(j, "stats");
                json_int_t prompt = json_integer_value(json_object_get(st, "prompt_tokens"));
                /* Parked and back: still only the new tokens run. */
                cr_assert_eq(json_integer_value(json_object_get(st, "prefilled_tokens")), prompt,
                             "session %d round %d re-prefilled", i, round);
                cr_assert_leq(json_integer_value(json_object_get(st, "cache_bytes_max")), per_turn);
                json_decref(j);
                break;
            }
            if (i % 10 == 0)
                check_cap(&d, cap);
        }
        check_cap(&d, cap);
    }
    cr_log_info("%d turn(s) refused with a retry hint", refused);
    cr_assert_gt(refused, 0, "the cap never had to refuse a turn");
    cr_assert_gt(metric(&d, "kvpd_parks_total"), 0);
    cr_assert_gt(metric(&d, "kvpd_unparks_total"), 0);
    cr_assert_eq(metric(&d, "kvpd_reserve_overruns_total"), 0);
    cr_assert_gt(metric(&d, "kvpd_evicted_rows_total"), 0, "no turn reached the budget");
    cr_assert_gt(metric(&d, "kvpd_sessions_parked"), 0);
    cr_assert_eq(metric(&d, "kvpd_sessions_resident") + metric(&d, "kvpd_sessions_parked"),
                 SESSIONS);
    cr_assert_eq(metric(&d, "kvpd_turns_total"), SESSIONS * ROUNDS);
    cr_assert_eq(metric(&d, "kvpd_cache_bytes_cap"), (double)cap);
    for (int i = 0; i < SESSIONS; i++)
        ws_close(&c[i]);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(memcap, fifty_sessions_under_a_cap_of_ten) { fifty_sessions_under_a_cap_of_ten("f32", "per_head"); }
Test(memcap, fifty_sessions_under_a_cap_of_ten_f16) { fifty_sessions_under_a_cap_of_ten("f16", "per_head"); }
Test(memcap, fifty_sessions_under_a_cap_of_ten_q8_0) { fifty_sessions_under_a_cap_of_ten("q8_0", "per_head"); }
Test(memcap, fifty_sessions_under_a_cap_of_ten_global) { fifty_sessions_under_a_cap_of_ten("f32", "global"); }
Test(memcap, fifty_sessions_under_a_cap_of_ten_global_f16) { fifty_sessions_under_a_cap_of_ten("f16", "global"); }
Test(memcap, fifty_sessions_under_a_cap_of_ten_global_q8_0) { fifty_sessions_under_a_cap_of_ten("q8_0", "global"); }

/* A turn's reservation counts the stored rows' real bytes. */
Test(memcap, reservation_follows_the_row_type)
{
    json_int_t f32 = turn_bytes("f32", "per_head"), f16 = turn_bytes("f16", "per_head"),
               q8 = turn_bytes("q8_0", "per_head");
    /* a global budget shares the same rows: the same reservation, every row type */
    cr_expect_eq(turn_bytes("f32", "global"), f32);
    cr_expect_eq(turn_bytes("f16", "global"), f16);
    cr_expect_eq(turn_bytes("q8_0", "global"), q8);
    /* stories260K: head_dim 8, per row 2 x (32 | 16 | 10) bytes + 20 of bookkeeping */
    cr_expect_eq(f32 * 52, f16 * 84, "f32 %lld f16 %lld", (long long)f32, (long long)f16);
    cr_expect_eq(f32 * 40, q8 * 84, "f32 %lld q8_0 %lld", (long long)f32, (long long)q8);
}

Test(memcap, max_sessions_counts_resident_sessions_only)
{
    char args[512];
    snprintf(args, sizeof args, "--state-dir %s --max-sessions 2", g_dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0);
    /* Five sessions one after another through two resident slots: the older idle ones
     * are parked to make room. */
    ws_client c[5];
    for (int i = 0; i < 5; i++) {
        cr_assert_eq(h_connect(&d, &c[i]), 0);
        h_turn_ok(&c[i], "A frog sat on a log.", 4);
    }
    cr_assert_eq(metric(&d, "kvpd_sessions_resident"), 2);
    cr_assert_eq(metric(&d, "kvpd_sessions_parked"), 3);
    /* The first comes back on its next message. */
    json_t *done = h_turn(&c[0], "It jumped.", 4, NULL);
    cr_assert(done);
    cr_assert_str_eq(str_of(done, "type"), "done");
    json_decref(done);
    cr_assert_eq(metric(&d, "kvpd_sessions_resident"), 2);
    for (int i = 0; i < 5; i++)
        ws_close(&c[i]);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* A request's n choices read the first choice's rows (share_rows): once they are done,
 * the first one's conversation holds them as one shared block, which /admin/stats and
 * /metrics report (counted once in resident_bytes); with --no-share-rows nothing is. */
static json_int_t shared_after_choices(const char *args, json_int_t *resident,
                                       json_int_t *borrowed, double *metric_shared)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0);
    char *raw = NULL;
    json_t *j = h_complete(&d, "{\"model\":\"m\",\"n\":3,\"max_tokens\":8,\"temperature\":0,"
                               "\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time "
                               "there was a little dog named Spot\"}]}", &raw);
    cr_assert_eq(json_array_size(json_object_get(j, "choices")), 3, "%s", raw);
    json_decref(j);
    free(raw);
    json_t *st = h_stats(&d);
    cr_assert(st);
    json_int_t shared = int_at(st, "memory", "shared_bytes");
    *resident = int_at(st, "memory", "resident_bytes");
    *borrowed = int_at(st, "memory", "borrowed_bytes");
    cr_assert(json_is_integer(json_object_get(json_object_get(st, "memory"), "shared_bytes")));
    json_decref(st);
    *metric_shared = metric(&d, "kvpd_cache_bytes_shared");
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    return shared;
}

Test(memcap, n_choices_share_rows_reported_once)
{
    json_int_t resident, borrowed;
    double m;
    json_int_t shared = shared_after_choices("--budget 0", &resident, &borrowed, &m);
    cr_assert_gt(shared, 0, "the choices' rows are not reported shared");
    cr_assert_leq(shared, resident, "shared %lld > resident %lld", (long long)shared,
                  (long long)resident);
    cr_assert_geq(borrowed, shared);
    cr_assert_eq((json_int_t)m, shared, "/metrics says %.0f, /admin/stats %lld", m,
                 (long long)shared);
    shared = shared_after_choices("--budget 0 --no-share-rows", &resident, &borrowed, &m);
    cr_assert_eq(shared, 0, "rows shared with --no-share-rows");
    cr_assert_eq(borrowed, 0);
    cr_assert_gt(resident, 0);
}
