/* Integration: HTTP endpoints, admin auth, the process (flags, SIGTERM). */
#include <criterion/criterion.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

static int run(const char *args, char **out)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s --model %s --tokenizer %s %s 2>&1", h_kvpd(),
             h_shared("models/stories260K.bin"), h_shared("models/tok512.bin"), args);
    FILE *f = popen(cmd, "r");
    cr_assert(f);
    size_t cap = 65536, n = 0;
    *out = calloc(1, cap);
    while (n + 1 < cap) {
        size_t r = fread(*out + n, 1, cap - n - 1, f);
        if (r == 0)
            break;
        n += r;
    }
    int st = pclose(f);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

Test(http, endpoints_and_metrics_pass_promtool, .timeout = 60)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    char *body = NULL;
    cr_assert_eq(h_get(&d, "/healthz", NULL, &body), 200);
    json_t *j = json_loads(body, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "status")), "ok");
    json_decref(j);
    free(body);

    /* A turn so the histograms and counters are not all zero. */
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    json_t *done = h_turn(&c, "Once upon a time", 8, NULL);
    cr_assert(done);
    json_decref(done);
    ws_close(&c);

    cr_assert_eq(h_get(&d, "/metrics", NULL, &body), 200);
    cr_assert(strstr(body, "# TYPE kvpd_ttft_seconds histogram"));
    cr_assert(strstr(body, "# TYPE kvpd_turn_duration_seconds histogram"));
    /* the step loop: 8 tokens plus the prompt ran in at least 9 steps of one turn each */
    cr_assert(strstr(body, "# TYPE kvpd_step_sessions histogram"));
    cr_assert(strstr(body, "# TYPE kvpd_step_duration_seconds histogram"));
    cr_assert(strstr(body, "kvpd_queue_wait_seconds_count 1\n"), "%s", body);
    cr_assert_geq(h_metric(body, "kvpd_step_sessions_count"), 8);
    cr_assert_eq(h_metric(body, "kvpd_step_sessions_sum"), h_metric(body, "kvpd_step_sessions_count"));
    cr_assert_gt(h_metric(body, "kvpd_step_tokens_sum"), h_metric(body, "kvpd_step_sessions_count"),
                 "the prompt's chunk ran in a step too");
    cr_assert(strstr(body, "kvpd_ttft_seconds_bucket{le=\"+Inf\"} 1\n"));
    cr_assert_eq(h_metric(body, "kvpd_turns_total"), 1);
    cr_assert_eq(h_metric(body, "kvpd_sessions_resident"), 1);
    cr_assert_null(strstr(body, "session=\""), "no label per session");
    char path[] = "/tmp/kvpd-metrics-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, body, strlen(body)), (ssize_t)strlen(body));
    close(fd);
    free(body);
    char cmd[256];
    snprintf(cmd, sizeof cmd, "promtool check metrics < %s", path);
    int st = system(cmd);
    unlink(path);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "promtool check metrics failed (is prometheus installed?)");

    cr_assert_eq(h_get(&d, "/", NULL, &body), 200);
    cr_assert(strstr(body, "<html"), "GET / is not the chat page");
    free(body);
    cr_assert_eq(h_get(&d, "/app.js", NULL, &body), 200);
    free(body);
    cr_assert_eq(h_get(&d, "/nope.html", NULL, &body), 404);
    free(body);
    cr_assert_eq(h_get(&d, "/../meson.build", NULL, &body), 404);
    free(body);
    cr_assert_eq(h_get(&d, "/chat", NULL, &body), 426);
    free(body);
    /* No token configured: the one generated into admin_token_file is required. */
    cr_assert_eq(h_get(&d, "/admin/stats", NULL, &body), 401);
    free(body);
    cr_assert_eq(strlen(h_admin_token(&d)), 32, "no generated token in %s", d.admin_file);
    cr_assert_eq(h_get(&d, "/admin/stats", h_admin_token(&d), &body), 200);
    j = json_loads(body, 0, NULL);
    cr_assert(j);
    for (const char *k = "uptime_s\0model\0policy\0budget\0sessions\0cache_bytes\0tokens\0"
                         "evicted_rows\0queue_depth\0session_list\0"; *k; k += strlen(k) + 1)
        cr_assert(json_object_get(j, k), "admin/stats lacks %s", k);
    json_t *batching = json_object_get(j, "batching");
    cr_assert_eq(json_integer_value(json_object_get(batching, "step_tokens")), 256);
    cr_assert_geq(json_integer_value(json_object_get(batching, "steps")), 8);
    cr_assert_eq(json_array_size(json_object_get(json_object_get(batching, "sessions_per_step"),
                                                 "counts")), 12);
    json_t *model = json_object_get(j, "model");
    /* stories260K.bin: all f32, about 1 MB */
    const char *mix = json_string_value(json_object_get(model, "weights"));
    cr_expect(mix && !strncmp(mix, "F32 1.", 6) && !strchr(mix, ','), "weights: %s", mix);
    cr_expect_gt(json_integer_value(json_object_get(model, "weight_bytes")), 1000000);
    json_t *s0 = json_array_get(json_object_get(j, "session_list"), 0);
    for (const char *k = "id\0turns\0rows\0bytes\0last_active_s_ago\0"; *k; k += strlen(k) + 1)
        cr_assert(json_object_get(s0, k), "session entry lacks %s", k);
    json_decref(j);
    free(body);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(http, a_port_in_use_is_an_error, .timeout = 60)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    char args[64], *out = NULL;
    snprintf(args, sizeof args, "--listen 127.0.0.1:%d", d.port);
    cr_assert_eq(run(args, &out), 1);
    cr_assert(strstr(out, "could not listen"), "%s", out);
    free(out);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(http, admin_token_is_required_when_set, .timeout = 60)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--admin-token s3cret"), 0);
    char *body = NULL;
    cr_assert_eq(h_get(&d, "/admin/stats", NULL, &body), 401);
    free(body);
    cr_assert_eq(h_get(&d, "/admin/stats", "wrong", &body), 401);
    free(body);
    cr_assert_eq(h_get(&d, "/admin/stats", "s3cre", &body), 401);
    free(body);
    cr_assert_eq(h_get(&d, "/admin/stats", "s3cret", &body), 200);
    cr_assert(strstr(body, "\"session_list\""));
    free(body);
    cr_assert_eq(h_get(&d, "/healthz", NULL, &body), 200);   /* probes stay open */
    free(body);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(http, sigterm_mid_generation_finishes_the_turn_and_exits_0, .timeout = 60)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-tokens 400 --budget 32 --chunk 8"), 0);
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"Once upon a time\",\"max_tokens\":400}"), 0);
    json_t *tok = h_expect(&c, "token", 10000);
    cr_assert(tok);
    json_decref(tok);
    kill(d.pid, SIGTERM);
    json_t *done = h_expect(&c, "done", 5000);
    cr_assert(done, "the in-flight turn got no done frame before shutdown");
    json_decref(done);
    ws_close(&c);
    int status = 0;
    double t0 = ws_now_ms();
    while (waitpid(d.pid, &status, WNOHANG) == 0 && ws_now_ms() - t0 < 8000)
        usleep(10000);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "kvpd did not exit 0");
    d.pid = 0;
    unlink(d.log);
}

Test(http, flags_check_config_version_help)
{
    char *out = NULL;
    cr_assert_eq(run("--check-config", &out), 0, "%s", out);
    cr_assert(strstr(out, "configuration ok"));
    free(out);
    cr_assert_eq(run("--check-config --budget many", &out), 2);
    free(out);
    cr_assert_eq(run("--check-config --policy no-such-policy", &out), 1);
    free(out);
    cr_assert_eq(run("--bogus-flag 1", &out), 2);
    free(out);
    /* The evaluation-only oracle is refused before anything starts. */
    cr_assert_eq(run("--policy oracle", &out), 2, "%s", out);
    cr_assert(strstr(out, "policy oracle is for evaluation only") && strstr(out, "snapkv expected_attention kvp"),
              "%s", out);
    free(out);
    cr_assert_eq(run("--version", &out), 0);
    cr_assert(strstr(out, "kvpd "));
    free(out);
    cr_assert_eq(run("--help", &out), 0);
    cr_assert(strstr(out, "--policy-file"));
    cr_assert(strstr(out, "--admin-token"));
    cr_assert_null(strstr(out, "oracle"), "%s", out);
    free(out);
    /* The sample config is complete and valid as shipped. */
    char args[1200];
    snprintf(args, sizeof args, "--config %s/systemd/kvpd.conf --check-config",
             getenv("KVP_SOURCE") ? getenv("KVP_SOURCE") : ".");
    cr_assert_eq(run(args, &out), 0, "%s", out);
    free(out);
}

Test(http, idle_sessions_are_dropped, .timeout = 60)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--idle-timeout 1"), 0);
    ws_client c, watcher;
    cr_assert_eq(h_connect(&d, &c), 0);
    json_t *done = h_turn(&c, "A frog sat.", 4, NULL);
    cr_assert(done);
    json_decref(done);
    cr_assert_eq(h_connect(&d, &watcher), 0);
    cr_assert_eq(ws_send_text(&watcher, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(&watcher, "session", 5000);
    cr_assert(s);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    /* The attached client is told; the id no longer resumes. */
    json_t *e = h_expect(&watcher, "error", 5000);
    cr_assert(e, "no expiry notice");
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "unknown_session");
    json_decref(e);
    char hello[128];
    snprintf(hello, sizeof hello, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(ws_send_text(&watcher, hello), 0);
    e = h_expect(&watcher, "error", 5000);
    cr_assert(e);
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "unknown_session");
    json_decref(e);
    char *body = NULL;
    cr_assert_eq(h_get(&d, "/metrics", NULL, &body), 200);
    cr_assert_eq(h_metric(body, "kvpd_sessions_resident"), 0);
    cr_assert_eq(h_metric(body, "kvpd_sessions_expired_total"), 2);
    free(body);
    ws_close(&c);
    ws_close(&watcher);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* The port is bound before the model is loaded: /healthz says 503 meanwhile, then 200.
 * A quantized synthetic model takes long enough to load (read + dequantize) to see it. */
Test(http, healthz_is_503_until_the_model_is_loaded, .timeout = 60)
{
    char dir[64], model[128], cmd[512];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(model, sizeof model, "%s/slow.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s synth --out %s --dim 768 --hidden 2048 --layers 4 --heads 12 "
             "--vocab 32000 --type q8_0 >/dev/null 2>&1", h_build("tools/kvp"), model);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    char extra[256];
    snprintf(extra, sizeof extra, "--model %s --policy streaming", model);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, extra), 0, "kvpd did not become healthy");
    cr_expect_gt(p.health_503, 0, "no 503 before the model was ready");
    char *body = NULL;
    cr_expect_eq(h_get(&p, "/healthz", NULL, &body), 200);
    cr_expect(body && strstr(body, "\"ok\""), "%s", body ? body : "(none)");
    free(body);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
    h_rmdir(dir);
}

/* An error answer: status, JSON in the API's error shape with this code, and the Allow
 * header when allow is not NULL (absent when it is). */
static void expect_json_error(const kvpd_proc *d, const char *method, const char *path,
                              int status, const char *code, const char *allow)
{
    char *raw = NULL;
    const char *body;
    int got = h_request(d->port, method, path, NULL, "", &raw, &body);
    cr_expect_eq(got, status, "%s %s: %s", method, path, raw);
    cr_expect(strcasestr(raw, "content-type: application/json"), "%s %s: %s", method, path, raw);
    json_t *j = json_loads(body, 0, NULL);
    json_t *e = json_object_get(j, "error");
    cr_expect(json_is_string(json_object_get(e, "message")), "%s %s: %s", method, path, body);
    cr_expect(json_is_string(json_object_get(e, "type")), "%s %s: %s", method, path, body);
    cr_expect_str_eq(json_string_value(json_object_get(e, "code")), code, "%s %s", method, path);
    const char *a = h_header(raw, "allow:");
    if (allow)
        cr_expect_str_eq(a, allow, "%s %s: allow %s", method, path, a);
    else
        cr_expect(!*a, "%s %s: an Allow header %s", method, path, a);
    json_decref(j);
    free(raw);
}

Test(http, unknown_paths_and_wrong_methods_answer_json, .timeout = 60)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    expect_json_error(&d, "POST", "/nosuch", 404, "unknown_url", NULL);
    expect_json_error(&d, "GET", "/nosuch", 404, "unknown_url", NULL);
    expect_json_error(&d, "DELETE", "/nosuch.html", 404, "unknown_url", NULL);
    expect_json_error(&d, "GET", "/v1/nosuch", 404, "unknown_url", NULL);
    expect_json_error(&d, "POST", "/healthz", 405, "method_not_allowed", "GET, HEAD");
    expect_json_error(&d, "POST", "/health", 405, "method_not_allowed", "GET, HEAD");
    expect_json_error(&d, "DELETE", "/metrics", 405, "method_not_allowed", "GET, HEAD");
    expect_json_error(&d, "POST", "/", 405, "method_not_allowed", "GET, HEAD");
    expect_json_error(&d, "PUT", "/v1/models", 405, "method_not_allowed", "GET");
    expect_json_error(&d, "GET", "/v1/chat/completions", 405, "method_not_allowed", "POST");
    expect_json_error(&d, "GET", "/completion", 405, "method_not_allowed", "POST");
    expect_json_error(&d, "DELETE", "/props", 405, "method_not_allowed", "GET");
    expect_json_error(&d, "POST", "/v1/responses/resp_x", 405, "method_not_allowed",
                      "GET, DELETE");
    expect_json_error(&d, "GET", "/v1/learn/transcripts", 405, "method_not_allowed", "DELETE");
    /* the daemon still serves */
    char *body = NULL;
    cr_expect_eq(h_get(&d, "/healthz", NULL, &body), 200);
    free(body);
    cr_expect_eq(kvpd_stop(&d, 10000), 0);
}
