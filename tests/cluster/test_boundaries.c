/* The new boundaries of a node that keeps its sessions in Redis (docs/cluster.md): a bad
 * state_url or an unreachable Redis at start (clear error, non-zero exit), Redis going
 * away mid-run (the turn is answered, not durable, counted; the next one after it comes
 * back is durable), a damaged value (moved aside, never loaded), hostile ?session= ids
 * (the upgrade is refused, the node keeps serving), and the metrics of a write. */
#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

static h_proc g_redis;
static char g_dir[64];

static void redis_up(void)
{
    h_redis_up(&g_redis, g_dir, sizeof g_dir, 0);
}

static void redis_down(void)
{
    h_redis_down(&g_redis, g_dir);
}

TestSuite(boundaries, .timeout = 90);

/* kvpd with `extra` must exit by itself: its status; its log into log. */
static int exit_status(const char *extra, char *log, size_t loglen)
{
    kvpd_proc p;
    int rc = kvpd_spawn(&p, extra);
    if (rc == 0)   /* it bound its port first: wait for it to give up */
        return kvpd_wait(&p, 20000);
    FILE *f = fopen(p.log, "r");
    size_t n = f ? fread(log, 1, loglen - 1, f) : 0;
    log[n] = '\0';
    if (f)
        fclose(f);
    unlink(p.log);
    return -2;   /* exited before binding: the harness reaped it */
}

Test(boundaries, a_malformed_state_url_is_refused_at_start)
{
    const char *bad[] = {"http://127.0.0.1:6379", "redis://", "redis://h:99999", "redis://h/x",
                         "redis://a%20b"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char extra[256], log[4096];
        snprintf(extra, sizeof extra, "--state-url %s", bad[i]);
        cr_assert_eq(exit_status(extra, log, sizeof log), -2, "kvpd started with %s", bad[i]);
        cr_assert(strstr(log, "state_url"), "no reason for %s: %s", bad[i], log);
    }
    char log[4096];
    cr_assert_eq(exit_status("--node-id bad/name", log, sizeof log), -2);
    cr_assert(strstr(log, "node_id"), "%s", log);
}

Test(boundaries, an_unreachable_redis_at_start_is_a_clear_error_and_a_non_zero_exit)
{
    char log[] = "/tmp/kvpd-test-XXXXXX", cmd[2048];
    int fd = mkstemp(log);
    cr_assert_geq(fd, 0);
    close(fd);
    /* the port stays bound (not listening) while kvpd runs: its connect is refused, and
     * no process started by a parallel test can take the port in between */
    int held = -1, port = h_closed_port(&held);
    cr_assert_gt(port, 0);
    snprintf(cmd, sizeof cmd, "'%s' --listen 127.0.0.1:0 --model '%s' --tokenizer '%s' "
             "--state-url redis://127.0.0.1:%d/0 2>'%s'", h_kvpd(),
             h_shared("models/stories260K.bin"), h_shared("models/tok512.bin"), port, log);
    int st = system(cmd);
    close(held);
    char text[8192] = "";
    FILE *f = fopen(log, "r");
    if (f) {
        text[fread(text, 1, sizeof text - 1, f)] = 0;
        fclose(f);
    }
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 1, "kvpd without its store: status %d: %s",
              st, text);
    char want[64];
    snprintf(want, sizeof want, "state_url redis://127.0.0.1:%d", port);
    cr_assert(strstr(text, want), "no reason naming the url: %s", text);
    cr_assert(strstr(text, "Connection refused"), "no cause: %s", text);
    unlink(log);
}

static json_t *turn(ws_client *c, const char *text)
{
    json_t *done = h_turn(c, text, 16, NULL);
    cr_assert(done);
    return done;
}

static double metric(const kvpd_proc *p, const char *name)
{
    char *body = NULL;
    cr_assert_eq(h_get(p, "/metrics", NULL, &body), 200);
    double v = h_metric(body, name);
    free(body);
    return v;
}

Test(boundaries, redis_away_mid_run_answers_the_turn_not_durable_and_counts_it,
     .init = redis_up, .fini = redis_down)
{
    char extra[128];
    /* the node serves from memory while Redis is away only while its lease surely lasts:
     * long enough for the steps below on a loaded machine */
    snprintf(extra, sizeof extra, "--state-url redis://127.0.0.1:%d/0 --lease-ms 5000",
             g_redis.port);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, extra), 0, "log %s", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(&c, "session", 5000);
    char hello[128];
    snprintf(hello, sizeof hello, "{\"type\":\"hello\",\"session\":\"%s\"}",
             json_string_value(json_object_get(s, "id")));
    json_decref(s);
    json_t *done = turn(&c, "Once upon a time");
    cr_assert(json_is_true(json_object_get(done, "durable")));
    json_decref(done);
    cr_assert_eq(metric(&p, "kvpd_snapshot_write_seconds_count"), 1);
    cr_assert_gt(metric(&p, "kvpd_snapshot_bytes_sum"), 1000, "a snapshot's bytes");
    int port = g_redis.port;
    h_proc_kill(&g_redis);
    /* the session is in memory: the turn is answered, its snapshot is not written */
    done = turn(&c, "The dog ran");
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    cr_assert(json_is_false(json_object_get(done, "durable")));
    cr_assert(strstr(json_string_value(json_object_get(done, "durable_error")), "redis"));
    json_decref(done);
    cr_assert_geq(metric(&p, "kvpd_store_errors_total"), 1);
    cr_assert_eq(metric(&p, "kvpd_snapshot_failures_total"), 1);
    char *body = NULL;
    cr_assert_eq(h_get(&p, "/healthz", NULL, &body), 503, "degraded while a turn is unsaved");
    free(body);
    /* resuming it while Redis is away keeps what memory holds (nothing is dropped) */
    cr_assert_eq(ws_send_text(&c, hello), 0);
    s = h_expect(&c, "session", 10000);
    cr_assert(s, "the session in memory is resumed without its store");
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 2);
    json_decref(s);
    /* back: the next turn writes the whole session, durable again */
    cr_assert_eq(h_redis_start(&g_redis, g_dir, port, 0), 0);
    done = turn(&c, "and then");
    cr_assert(json_is_true(json_object_get(done, "durable")));
    json_decref(done);
    redisContext *r = redisConnect("127.0.0.1", port);
    cr_assert(r && !r->err);
    redisReply *keys = redisCommand(r, "KEYS turns:*");
    cr_assert_eq(keys->elements, 1);
    redisReply *t = redisCommand(r, "GET %s", keys->element[0]->str);
    cr_assert_str_eq(t->str, "3", "all three turns are in Redis");
    freeReplyObject(t);
    freeReplyObject(keys);
    redisFree(r);
    cr_assert_eq(h_get(&p, "/healthz", NULL, &body), 200);
    free(body);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}

Test(boundaries, a_damaged_redis_value_is_moved_aside_and_the_session_reported_lost,
     .init = redis_up, .fini = redis_down)
{
    char extra[128];
    snprintf(extra, sizeof extra, "--state-url redis://127.0.0.1:%d/0", g_redis.port);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, extra), 0, "log %s", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    json_decref(turn(&c, "Once upon a time"));
    ws_close(&c);
    redisContext *r = redisConnect("127.0.0.1", g_redis.port);
    cr_assert(r && !r->err);
    redisReply *keys = redisCommand(r, "KEYS snap:*");
    cr_assert_eq(keys->elements, 1);
    char id[64];
    snprintf(id, sizeof id, "%s", keys->element[0]->str + 5);
    freeReplyObject(keys);
    freeReplyObject(redisCommand(r, "SETRANGE snap:%s 30 XXXX", id));
    /* a new node (the session is not in its memory) reads it */
    kvpd_proc q;
    cr_assert_eq(kvpd_start(&q, extra), 0, "log %s", q.log);
    cr_assert_eq(h_connect(&q, &c), 0);
    char hello[128];
    snprintf(hello, sizeof hello, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(ws_send_text(&c, hello), 0);
    json_t *e = h_expect(&c, "error", 10000);
    cr_assert(e);
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "unknown_session");
    cr_assert(strstr(json_string_value(json_object_get(e, "message")), "damaged"));
    json_decref(e);
    keys = redisCommand(r, "KEYS damaged:%s:*", id);
    cr_assert_eq(keys->elements, 1, "moved aside to a damaged: key");
    freeReplyObject(keys);
    cr_assert(kvpd_log_has(&q, "moved aside to damaged:"));
    /* never loaded again; the node goes on serving */
    cr_assert_eq(ws_send_text(&c, hello), 0);
    e = h_expect(&c, "error", 10000);
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "unknown_session");
    json_decref(e);
    json_t *done = turn(&c, "A new story");
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);
    ws_close(&c);
    redisFree(r);
    cr_assert_eq(kvpd_stop(&q, 10000), 0);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
}

Test(boundaries, hostile_session_ids_in_the_url_are_refused_at_the_upgrade)
{
    char dir[64];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    char extra[128];
    snprintf(extra, sizeof extra, "--state-dir %s", dir);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, extra), 0, "log %s", p.log);
    static char huge[9000];
    memcpy(huge, "/chat?session=", 14);
    memset(huge + 14, 'a', sizeof huge - 15);
    const char *bad[] = {
        "/chat?session=0123456789abcdef0123456789ABCDEF",        /* uppercase */
        "/chat?session=0123456789abcdef0123456789abcde",         /* 31 */
        "/chat?session=0123456789abcdef0123456789abcdef0",       /* 33 */
        "/chat?session=../../../../etc/passwd",
        "/chat?session=",
        "/chat?session=0123456789abcdef%00123456789abcdef",
        "/chat?session=0123456789abcdef0123456789abcdef&session=0123456789abcdef0123456789abcdef",
        huge,
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        ws_client c;
        int rc = ws_connect(&c, "127.0.0.1", p.port, bad[i], 5000);
        if (rc == 0)
            ws_close(&c);
        cr_assert_lt(rc, 0, "upgrade accepted: %.80s", bad[i]);
    }
    /* a good one: a hello without an id resumes the URL's session */
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(&c, "session", 5000);
    char id[40], path[80];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    json_decref(h_turn(&c, "Once upon a time", 8, NULL));
    ws_close(&c);
    snprintf(path, sizeof path, "/chat?session=%s&other=1", id);
    cr_assert_eq(ws_connect(&c, "127.0.0.1", p.port, path, 5000), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    s = h_expect(&c, "session", 5000);
    cr_assert(s);
    cr_assert_str_eq(json_string_value(json_object_get(s, "id")), id);
    cr_assert(json_is_true(json_object_get(s, "resumed")));
    json_decref(s);
    /* a hello naming another session on that connection is refused */
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\",\"session\":\"0123456789abcdef0123456789abcdef\"}"), 0);
    json_t *e = h_expect(&c, "error", 5000);
    cr_assert_str_eq(json_string_value(json_object_get(e, "code")), "bad_request");
    json_decref(e);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
    h_rmdir(dir);
}

/* The OpenAI API across nodes: a conversation started on one node is continued on
 * another (the request names it by X-Session-Id), from its Redis snapshot, recomputing
 * only the new message; while the first node holds it, the answer is 503 elsewhere. */
Test(boundaries, the_openai_api_continues_a_named_conversation_on_another_node,
     .init = redis_up, .fini = redis_down)
{
    char extra[128];
    snprintf(extra, sizeof extra, "--state-url redis://127.0.0.1:%d/0 --lease-ms 60000",
             g_redis.port);
    kvpd_proc a, b;
    cr_assert_eq(kvpd_start(&a, extra), 0, "log %s", a.log);
    cr_assert_eq(kvpd_start(&b, extra), 0, "log %s", b.log);
    char *raw;
    const char *body;
    /* a well-formed id nobody has: a new conversation (its history prefilled) */
    int st = h_request(a.port, "POST", "/v1/chat/completions",
                       "X-Session-Id: 0123456789abcdef0123456789abcdef\r\n",
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                       "{\"role\":\"assistant\",\"content\":\"Hello\"},"
                       "{\"role\":\"user\",\"content\":\"Once\"}],\"max_tokens\":4}",
                       &raw, &body);
    cr_assert_eq(st, 200, "%s", raw);
    cr_assert_neq(strcmp(h_header(raw, "x-session-id:"), "0123456789abcdef0123456789abcdef"), 0);
    free(raw);
    st = h_request(a.port, "POST", "/v1/chat/completions", NULL,
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
                       "\"max_tokens\":8}", &raw, &body);
    cr_assert_eq(st, 200, "%s", raw);
    char sid[64];
    snprintf(sid, sizeof sid, "%s", h_header(raw, "x-session-id:"));
    cr_assert_eq(strlen(sid), 32, "%s", raw);
    json_t *j = json_loads(body, 0, NULL);
    json_t *msg = json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message");
    json_t *u = json_object_get(j, "usage");
    int p1 = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
    int c1 = (int)json_integer_value(json_object_get(u, "completion_tokens"));
    json_t *req = json_pack("{s:[{s:s, s:s}, {s:s, s:O}, {s:s, s:s}], s:i}", "messages",
                            "role", "user", "content", "Once upon a time", "role", "assistant",
                            "content", json_object_get(msg, "content"), "role", "user",
                            "content", "The dog", "max_tokens", 6);
    char *next = json_dumps(req, 0);
    json_decref(req);
    json_decref(j);
    free(raw);
    char hdr[96];
    snprintf(hdr, sizeof hdr, "X-Session-Id: %s\r\n", sid);
    /* b holds the lease now, for a long time: a asks, and is told to retry elsewhere */
    redisContext *r = redisConnect("127.0.0.1", g_redis.port);
    cr_assert(r && !r->err);
    freeReplyObject(redisCommand(r, "SET lease:%s someone-else PX 3000", sid));
    st = h_request(b.port, "POST", "/v1/chat/completions", hdr, next, &raw, &body);
    if (st != 503)
        fprintf(stderr, "answer: %s\n", raw);
    cr_assert_eq(st, 503);
    cr_assert(strstr(body, "\"elsewhere\""), "%s", body);
    int retry = atoi(h_header(raw, "retry-after:"));
    cr_assert(retry >= 1 && retry <= 3, "Retry-After: %d", retry);
    free(raw);
    freeReplyObject(redisCommand(r, "DEL lease:%s", sid));
    redisFree(r);
    /* free: b continues it from the snapshot a wrote */
    st = h_request(b.port, "POST", "/v1/chat/completions", hdr, next, &raw, &body);
    cr_assert_eq(st, 200, "%s", raw);
    cr_assert_str_eq(h_header(raw, "x-session-id:"), sid);
    j = json_loads(body, 0, NULL);
    u = json_object_get(j, "usage");
    int p2 = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
    int cached = (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                         "cached_tokens"));
    cr_assert_geq(cached, p1 + c1 - 1, "turn 1 was recomputed on the other node (cached %d)",
                  cached);
    cr_assert_lt(p2 - cached, 12, "only the new message is prefilled");
    json_decref(j);
    free(raw);
    free(next);
    cr_assert(kvpd_log_has(&b, "loaded from its snapshot"));
    cr_assert_eq(kvpd_stop(&b, 10000), 0);
    cr_assert_eq(kvpd_stop(&a, 10000), 0);
}
