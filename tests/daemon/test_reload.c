/* Integration: SIGHUP re-reads the config file and the policy file; a bad one is
 * refused with a log line while the old configuration keeps serving. */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "tests/daemon/harness.h"

static char g_dir[128], g_conf[256], g_kvp[256];

static void setup(void)
{
    cr_assert_eq(h_mkdtemp(g_dir, sizeof g_dir), 0);
    snprintf(g_conf, sizeof g_conf, "%s/kvpd.conf", g_dir);
    snprintf(g_kvp, sizeof g_kvp, "%s/policy.kvp", g_dir);
}

static void teardown(void)
{
    h_rmdir(g_dir);
}

TestSuite(reload, .init = setup, .fini = teardown, .timeout = 60);

static void write_file(const char *path, const void *data, size_t len)
{
    FILE *f = fopen(path, "wb");
    cr_assert(f);
    cr_assert_eq(fwrite(data, 1, len, f), len);
    cr_assert_eq(fclose(f), 0);
}

static void write_conf(const char *text)
{
    write_file(g_conf, text, strlen(text));
}

/* The shipped stories260K policy, copied to where the config points. */
static void write_good_policy(void)
{
    char src[1024];
    snprintf(src, sizeof src, "%s/policy/weights/stories260K.kvp",
             getenv("KVP_SOURCE") ? getenv("KVP_SOURCE") : ".");
    FILE *f = fopen(src, "rb");
    cr_assert(f, "%s", src);
    static char buf[1 << 22];
    size_t n = fread(buf, 1, sizeof buf, f);
    fclose(f);
    cr_assert_gt(n, 0);
    write_file(g_kvp, buf, n);
}

static const char *str_of(json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

static json_int_t reload_count(const kvpd_proc *d, const char *key)
{
    json_t *st = h_stats(d);
    cr_assert(st);
    json_int_t n = json_integer_value(json_object_get(json_object_get(st, "persistence"), key));
    json_decref(st);
    return n;
}

/* Sends SIGHUP and waits for the reload to be applied or refused. */
static void sighup(kvpd_proc *d, const char *counter, json_int_t want)
{
    kill(d->pid, SIGHUP);
    for (int i = 0; i < 200 && reload_count(d, counter) < want; i++)
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    cr_assert_eq(reload_count(d, counter), want, "%s did not reach %lld", counter, (long long)want);
}

static const char *policy_in_force(const kvpd_proc *d, char *buf, size_t n)
{
    json_t *st = h_stats(d);
    cr_assert(st);
    snprintf(buf, n, "%s", str_of(st, "policy"));
    json_decref(st);
    return buf;
}

Test(reload, a_broken_policy_file_is_refused_and_the_old_policy_keeps_serving)
{
    write_conf("policy = streaming\n");
    char args[512], pol[64];
    snprintf(args, sizeof args, "--config %s", g_conf);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    cr_assert_str_eq(policy_in_force(&d, pol, sizeof pol), "streaming");
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    h_turn_ok(&c, "A frog sat on a log.", 8);

    /* A policy file that is not one. */
    write_file(g_kvp, "this is not a KVP policy file\n", 30);
    char conf[600];
    snprintf(conf, sizeof conf, "policy = kvp\npolicy_file = %s\n", g_kvp);
    write_conf(conf);
    sighup(&d, "reloads_refused", 1);
    cr_assert(kvpd_log_has(&d, "reload refused"), "no log line for the refused reload");
    cr_assert_str_eq(policy_in_force(&d, pol, sizeof pol), "streaming");
    h_turn_ok(&c, "A frog sat on a log.", 8);
    ws_client n;
    cr_assert_eq(h_connect(&d, &n), 0);
    h_turn_ok(&n, "A frog sat on a log.", 8);   /* new sessions too */
    ws_close(&n);

    /* A config file with a syntax error: refused the same way. */
    write_conf("policy = kvp\nthis line is wrong\n");
    sighup(&d, "reloads_refused", 2);
    cr_assert_str_eq(policy_in_force(&d, pol, sizeof pol), "streaming");
    h_turn_ok(&c, "A frog sat on a log.", 8);

    /* The evaluation-only oracle: refused, naming the policies kvpd serves. */
    write_conf("policy = oracle\n");
    sighup(&d, "reloads_refused", 3);
    cr_assert(kvpd_log_has(&d, "policy oracle is for evaluation only"), "%s", d.log);
    cr_assert_str_eq(policy_in_force(&d, pol, sizeof pol), "streaming");
    h_turn_ok(&c, "A frog sat on a log.", 8);

    /* A good file: new sessions get it, the resident one keeps its own. */
    write_good_policy();
    write_conf(conf);
    sighup(&d, "reloads", 1);
    cr_assert_str_eq(policy_in_force(&d, pol, sizeof pol), "kvp");
    cr_assert_eq(h_connect(&d, &n), 0);
    h_turn_ok(&n, "A frog sat on a log.", 8);
    h_turn_ok(&c, "A frog sat on a log.", 8);
    json_t *st = h_stats(&d);
    json_t *list = json_object_get(st, "session_list");
    int kvp = 0, streaming = 0;
    for (size_t i = 0; i < json_array_size(list); i++) {
        const char *p = str_of(json_array_get(list, i), "policy");
        kvp += !strcmp(p, "kvp");
        streaming += !strcmp(p, "streaming");
    }
    json_decref(st);
    cr_assert_eq(kvp, 1);
    cr_assert_eq(streaming, 2);
    ws_close(&n);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(reload, live_keys_apply_and_the_others_wait_for_a_restart)
{
    write_conf("policy = streaming\n");
    char args[512];
    snprintf(args, sizeof args, "--config %s", g_conf);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0);
    write_conf("policy = h2o\nadmin_token = s3cret\ntop_p = 0.5\n");
    kill(d.pid, SIGHUP);
    char *body = NULL;
    int st = 401;
    for (int i = 0; i < 200 && st == 401; i++) {
        free(body);
        body = NULL;
        st = h_get(&d, "/admin/stats", "s3cret", &body);
        if (st == 401)
            nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    cr_assert_eq(st, 200, "the new admin token is not accepted");
    char *other = NULL;
    cr_assert_eq(h_get(&d, "/admin/stats", h_admin_token(&d), &other), 401,
                 "the token generated at start still opens /admin/* after the reload");
    free(other);
    json_t *j = json_loads(body, 0, NULL);
    free(body);
    cr_assert_str_eq(str_of(j, "policy"), "h2o");
    json_decref(j);
    cr_assert(kvpd_log_has(&d, "top_p changed; that takes a restart"));
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
