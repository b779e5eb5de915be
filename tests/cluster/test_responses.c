/* Stored responses in Redis (docs/cluster.md, "What Redis keeps"): two nodes sharing one
 * Redis serve one chain through previous_response_id turn by turn, across a kill -9 of
 * one node; a stored response is retrievable and deletable on either node, by its own
 * tenant only; store:false writes no key (a new conversation's or one continuing a
 * chain, on either node: every key and value is as it was); the per-tenant bound counts
 * the responses of both nodes; a damaged or truncated record in Redis is refused with a
 * log line and a 404 while the node keeps serving. */
#include <criterion/criterion.h>
#include <hiredis/hiredis.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

#define LEASE_MS 1000
#define KA "Authorization: Bearer key-a\r\n"
#define KB "Authorization: Bearer key-b\r\n"

static h_proc g_redis;
static char g_dir[64];
static kvpd_proc g_node[2];
static redisContext *g_rc;

static void node_start(int k, const char *more)
{
    char extra[512];
    snprintf(extra, sizeof extra, "--state-url redis://127.0.0.1:%d/0 --lease-ms %d "
             "--node-id n%d --max-tokens 64 --api-key key-a,key-b %s", g_redis.port, LEASE_MS,
             k, more ? more : "");
    cr_assert_eq(kvpd_start(&g_node[k], extra), 0, "node %d did not start (log %s)", k,
                 g_node[k].log);
}

static void up(void)
{
    h_redis_up(&g_redis, g_dir, sizeof g_dir, 0);
    g_rc = redisConnect("127.0.0.1", g_redis.port);
    cr_assert(g_rc && !g_rc->err);
}

static void down(void)
{
    for (int k = 0; k < 2; k++)
        if (g_node[k].pid > 0)
            kvpd_kill(&g_node[k]);
    memset(g_node, 0, sizeof g_node);
    if (g_rc)
        redisFree(g_rc);
    g_rc = NULL;
    h_redis_down(&g_redis, g_dir);
}

TestSuite(cluster_responses, .init = up, .fini = down, .timeout = 120);

static void nap_ms(int ms)
{
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

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

/* One turn on node k (continuing prev when not NULL), sent again while the session's
 * lease is still the other node's (503 elsewhere); the response (200 asserted). */
static json_t *turn(int k, const char *headers, const char *input, const char *prev,
                    const char *more)
{
    char body[512];
    int n = snprintf(body, sizeof body, "{\"input\":\"%s\",\"max_output_tokens\":4%s", input,
                     more ? more : "");
    if (prev)
        n += snprintf(body + n, sizeof body - (size_t)n, ",\"previous_response_id\":\"%s\"",
                      prev);
    snprintf(body + n, sizeof body - (size_t)n, "}");
    json_t *j = NULL;
    int status = 0;
    for (int tries = 0; tries < 40; tries++) {
        json_decref(j);
        status = call(&g_node[k], "POST", "/v1/responses", headers, body, &j);
        if (status != 503)
            break;
        nap_ms(200);
    }
    cr_assert_eq(status, 200, "node %d: %s: %d (log %s)", k, body, status, g_node[k].log);
    if (prev)
        cr_expect_str_eq(json_string_value(json_object_get(j, "previous_response_id")), prev);
    return j;
}

static const char *id_of(json_t *j)
{
    return json_string_value(json_object_get(j, "id"));
}

static int get(int k, const char *headers, const char *id, json_t **out)
{
    char path[512];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    return call(&g_node[k], "GET", path, headers, "", out);
}

static long long keys(const char *pattern)
{
    redisReply *r = redisCommand(g_rc, "KEYS %s", pattern);
    cr_assert(r && r->type == REDIS_REPLY_ARRAY);
    long long n = (long long)r->elements;
    freeReplyObject(r);
    return n;
}

/* Every key but the leases (which come and go with each job) with a hash of its value,
 * sorted, one a line, into out: a key written, added or removed changes it. */
static void keyspace(char *out, size_t n)
{
    redisReply *r = redisCommand(g_rc, "KEYS *");
    cr_assert(r && r->type == REDIS_REPLY_ARRAY);
    char **lines = calloc(r->elements + 1, sizeof *lines);
    size_t k = 0;
    for (size_t i = 0; i < r->elements; i++) {
        const char *key = r->element[i]->str;
        if (!strncmp(key, "lease:", 6))
            continue;
        redisReply *v = redisCommand(g_rc, "DUMP %s", key);
        cr_assert(v && v->type == REDIS_REPLY_STRING, "DUMP %s", key);
        uint64_t h = 1469598103934665603ull;   /* FNV-1a of the value */
        for (size_t j = 0; j < v->len; j++)
            h = (h ^ (unsigned char)v->str[j]) * 1099511628211ull;
        char line[256];
        snprintf(line, sizeof line, "%s %016llx\n", key, (unsigned long long)h);
        lines[k++] = strdup(line);
        freeReplyObject(v);
    }
    freeReplyObject(r);
    for (size_t i = 1; i < k; i++)   /* sorted (few keys) */
        for (size_t j = i; j > 0 && strcmp(lines[j - 1], lines[j]) > 0; j--) {
            char *t = lines[j];
            lines[j] = lines[j - 1];
            lines[j - 1] = t;
        }
    size_t at = 0;
    out[0] = '\0';
    for (size_t i = 0; i < k; i++) {
        at += (size_t)snprintf(out + at, at < n ? n - at : 0, "%s", lines[i]);
        free(lines[i]);
    }
    free(lines);
    cr_assert_lt(at, n);
}

Test(cluster_responses, store_false_on_either_node_leaves_every_key_as_it_was)
{
    node_start(0, NULL);
    node_start(1, NULL);
    json_t *a = turn(0, KA, "Once upon a time", NULL, NULL);
    char ida[64];
    snprintf(ida, sizeof ida, "%s", id_of(a));
    json_decref(a);
    nap_ms(LEASE_MS + 300);   /* the turn's lease is gone */
    char before[8192], after[8192];
    keyspace(before, sizeof before);
    cr_assert(strstr(before, "snap:"), "%s", before);
    /* a new conversation on node 1; the chain continued on node 0 (which holds its
     * session) and on node 1 (which does not) */
    json_t *f[3] = {turn(1, KA, "A purple elephant", NULL, ",\"store\":false"),
                    turn(0, KA, " A purple elephant sang", ida, ",\"store\":false"),
                    turn(1, KA, " A purple elephant danced", ida, ",\"store\":false")};
    nap_ms(LEASE_MS + 300);
    keyspace(after, sizeof after);
    cr_expect_str_eq(after, before, "store:false changed what Redis keeps");
    for (int i = 0; i < 3; i++) {
        cr_expect_eq(get(i & 1, KA, id_of(f[i]), NULL), 404, "store:false response %d", i + 1);
        cr_expect(!json_string_value(json_object_get(json_object_get(f[i], "kvpd"), "session")),
                  "store:false response %d names a session", i + 1);
        json_decref(f[i]);
    }
    /* the chain goes on, on either node */
    json_decref(turn(1, KA, " Then the sun", ida, NULL));
    cr_expect_eq(keys("resp:*"), 2);
}

Test(cluster_responses, a_chain_of_five_goes_from_node_to_node_and_through_a_kill9)
{
    node_start(0, NULL);
    node_start(1, NULL);
    char id[5][64];
    json_int_t input[5];
    static const char *const in[5] = {"Once upon a time", " Then the sun", " And a dog",
                                      " The dog ran", " The end"};
    int on[5] = {0, 1, 0, 1, 1};
    for (int i = 0; i < 5; i++) {
        if (i == 3)   /* node 0 served turn 3, then dies; node 1 takes the chain on */
            kvpd_kill(&g_node[0]);
        json_t *j = turn(on[i], KA, in[i], i ? id[i - 1] : NULL, NULL);
        snprintf(id[i], sizeof id[i], "%s", id_of(j));
        input[i] = json_integer_value(json_object_get(json_object_get(j, "usage"),
                                                      "input_tokens"));
        json_int_t cached = json_integer_value(json_object_get(json_object_get(json_object_get(
            j, "usage"), "input_tokens_details"), "cached_tokens"));
        if (i) {
            cr_expect_gt(input[i], input[i - 1], "turn %d's prompt does not hold turn %d's",
                         i + 1, i);
            /* the node the turn lands on reads the chain's session from Redis: the
             * history is cached, not prefilled again */
            cr_expect_gt(cached, input[i - 1] / 2, "turn %d on node %d: %lld of %lld cached",
                         i + 1, on[i], (long long)cached, (long long)input[i]);
        }
        json_decref(j);
    }
    cr_expect_eq(keys("resp:*"), 5);
    node_start(0, NULL);
    for (int i = 0; i < 5; i++) {
        cr_expect_eq(get(0, KA, id[i], NULL), 200, "node 0: response %d", i + 1);
        cr_expect_eq(get(1, KB, id[i], NULL), 404, "another tenant read response %d", i + 1);
    }
}

Test(cluster_responses, delete_on_one_node_is_gone_on_the_other_and_store_false_writes_nothing)
{
    node_start(0, NULL);
    node_start(1, NULL);
    json_t *j = turn(0, KA, "Once upon a time", NULL, NULL);
    char id[64];
    snprintf(id, sizeof id, "%s", id_of(j));
    json_decref(j);
    cr_expect_eq(get(1, KA, id, NULL), 200);
    char path[512];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    cr_expect_eq(call(&g_node[1], "DELETE", path, KB, "", NULL), 404, "B deleted A's");
    cr_expect_eq(keys("resp:*"), 1);
    cr_expect_eq(call(&g_node[1], "DELETE", path, KA, "", NULL), 200);
    cr_expect_eq(keys("resp:*"), 0, "DELETE left the record in Redis");
    cr_expect_eq(get(0, KA, id, NULL), 404, "node 0 still has the deleted response");
    j = turn(1, KA, "Hi", NULL, ",\"store\":false");
    snprintf(id, sizeof id, "%s", id_of(j));
    json_decref(j);
    cr_expect_eq(keys("resp:*"), 0, "store:false wrote a record");
    cr_expect_eq(get(0, KA, id, NULL), 404);
}

Test(cluster_responses, the_bound_counts_both_nodes_responses)
{
    node_start(0, "--max-stored-responses-per-tenant 2");
    node_start(1, "--max-stored-responses-per-tenant 2");
    char id[3][64], b[64];
    json_t *j = turn(1, KB, "y", NULL, NULL);
    snprintf(b, sizeof b, "%s", id_of(j));
    json_decref(j);
    for (int i = 0; i < 3; i++) {
        j = turn(i % 2, KA, "x", NULL, NULL);
        snprintf(id[i], sizeof id[i], "%s", id_of(j));
        json_decref(j);
    }
    cr_expect_eq(get(1, KA, id[0], NULL), 404, "A's oldest was kept past its bound");
    cr_expect_eq(get(1, KA, id[1], NULL), 200);
    cr_expect_eq(get(0, KA, id[2], NULL), 200);
    cr_expect_eq(get(0, KB, b, NULL), 200, "A's bound dropped B's response");
    cr_expect_eq(keys("resp:*"), 3);
}

Test(cluster_responses, a_damaged_record_in_redis_is_refused_with_a_log_line_and_a_404)
{
    node_start(0, NULL);
    char id[3][64];
    for (int i = 0; i < 3; i++) {
        json_t *j = turn(0, KA, "Once upon a time", NULL, NULL);
        snprintf(id[i], sizeof id[i], "%s", id_of(j));
        json_decref(j);
    }
    char key[80];
    snprintf(key, sizeof key, "resp:%s", id[0]);   /* truncated */
    redisReply *r = redisCommand(g_rc, "GETRANGE %s 0 59", key);
    cr_assert(r && r->type == REDIS_REPLY_STRING && r->len == 60);
    redisReply *w = redisCommand(g_rc, "SET %s %b", key, r->str, r->len);
    cr_assert(w);
    freeReplyObject(w);
    freeReplyObject(r);
    snprintf(key, sizeof key, "resp:%s", id[1]);   /* one byte of the payload flipped */
    r = redisCommand(g_rc, "GET %s", key);
    cr_assert(r && r->type == REDIS_REPLY_STRING);
    r->str[r->len - 20] ^= 1;
    w = redisCommand(g_rc, "SET %s %b", key, r->str, r->len);
    freeReplyObject(w);
    freeReplyObject(r);
    cr_expect_eq(get(0, KA, id[0], NULL), 404);
    cr_expect(kvpd_log_has(&g_node[0], "truncated"), "log %s", g_node[0].log);
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", id[1]);
    cr_expect_eq(call(&g_node[0], "POST", "/v1/responses", KA, body, NULL), 400);
    cr_expect(kvpd_log_has(&g_node[0], "checksum mismatch"), "log %s", g_node[0].log);
    cr_expect_eq(get(0, KA, id[2], NULL), 200);
    json_decref(turn(0, KA, " Then", id[2], NULL));
}

/* A store that does not answer is an error of the server's (500 naming it), never "no
 * such response", and the node goes on answering. */
Test(cluster_responses, with_redis_gone_a_read_is_a_500_and_the_node_serves_on)
{
    node_start(0, NULL);
    json_t *j = turn(0, KA, "Once upon a time", NULL, NULL);
    char id[64];
    snprintf(id, sizeof id, "%s", id_of(j));
    json_decref(j);
    redisFree(g_rc);
    g_rc = NULL;
    cr_assert_eq(h_proc_stop(&g_redis, 5000), 0);
    json_t *e;
    cr_expect_eq(get(0, KA, id, &e), 500, "a store that does not answer is no 404");
    const char *msg = json_string_value(json_object_get(json_object_get(e, "error"), "message"));
    cr_expect(msg && strstr(msg, "could not be read"), "%s", msg);
    json_decref(e);
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", id);
    cr_expect_eq(call(&g_node[0], "POST", "/v1/responses", KA, body, NULL), 500);
    cr_expect_eq(call(&g_node[0], "GET", "/v1/models", KA, "", NULL), 200, "the node stopped serving");
}
