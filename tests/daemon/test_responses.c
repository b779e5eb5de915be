/* Stored responses in the state directory (docs/openai.md, "Responses"): a chain through
 * previous_response_id goes on after a SIGTERM restart and after kill -9 (from the last
 * completed turn), each stored response stays retrievable by its own tenant only, DELETE
 * removes it for good, store:false keeps nothing (no record, no snapshot or index entry,
 * no learn_dir transcript, the stored chain it continues unchanged), the per-tenant
 * bounds hold across a restart, and damaged records and hostile ids are refused while
 * the daemon keeps serving. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/clock.h"

#include "store/responses.h"
#include "tests/daemon/harness.h"

H_STATE_DIR_SUITE(responses, .timeout = 120);

#define KA "Authorization: Bearer key-a\r\n"
#define KB "Authorization: Bearer key-b\r\n"

static void start(kvpd_proc *d, const char *more)
{
    char args[512];
    snprintf(args, sizeof args, "--state-dir %s --max-tokens 64 %s", g_dir, more ? more : "");
    cr_assert_eq(kvpd_start(d, args), 0, "kvpd did not start (log %s)", d->log);
}

/* A request's status; its body as JSON into *out (when not NULL, NULL when not JSON). */
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

static const char *str(json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

static json_int_t usage(json_t *j, const char *key)
{
    return json_integer_value(json_object_get(json_object_get(j, "usage"), key));
}

/* POSTs one turn (continuing prev when not NULL) and asserts 200: the response. */
static json_t *turn(const kvpd_proc *d, const char *headers, const char *input,
                    const char *prev, const char *more)
{
    char body[1024];
    int n = snprintf(body, sizeof body, "{\"instructions\":\"A story.\",\"input\":\"%s\","
                     "\"max_output_tokens\":4%s", input, more ? more : "");
    if (prev)
        n += snprintf(body + n, sizeof body - (size_t)n, ",\"previous_response_id\":\"%s\"",
                      prev);
    snprintf(body + n, sizeof body - (size_t)n, "}");
    json_t *j;
    int status = call(d, "POST", "/v1/responses", headers, body, &j);
    cr_assert_eq(status, 200, "%s: %d %s (log %s)", body, status, j ? json_dumps(j, 0) : "",
                 d->log);
    cr_assert(str(j, "id"));
    if (prev)
        cr_expect_str_eq(str(j, "previous_response_id"), prev);
    return j;
}

static int get(const kvpd_proc *d, const char *headers, const char *id, json_t **out)
{
    char path[600];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    return call(d, "GET", path, headers, "", out);
}

static int del(const kvpd_proc *d, const char *headers, const char *id)
{
    char path[600];
    snprintf(path, sizeof path, "/v1/responses/%s", id);
    return call(d, "DELETE", path, headers, "", NULL);
}

static int n_records(void)
{
    char dir[256];
    snprintf(dir, sizeof dir, "%s/responses", g_dir);
    return h_count_files(dir, ".resp");
}

Test(responses, a_chain_of_five_goes_on_after_sigterm_and_kill9_restarts)
{
    kvpd_proc d;
    start(&d, NULL);
    char id[5][64], text[5][512];
    json_int_t input[5];
    static const char *const in[5] = {"Once upon a time", " Then the sun", " And a dog",
                                      " The dog ran", " The end"};
    for (int i = 0; i < 5; i++) {
        if (i == 2) {          /* a clean stop between turns 2 and 3 */
            cr_assert_eq(kvpd_stop(&d, 10000), 0);
            start(&d, NULL);
        } else if (i == 4) {   /* a crash after turn 4's answer: turn 4 is kept */
            kvpd_kill(&d);
            start(&d, NULL);
        }
        json_t *j = turn(&d, NULL, in[i], i ? id[i - 1] : NULL, NULL);
        snprintf(id[i], sizeof id[i], "%s", str(j, "id"));
        snprintf(text[i], sizeof text[i], "%s", str(j, "output_text"));
        input[i] = usage(j, "input_tokens");
        /* the whole conversation so far is the prompt: each turn's holds the last's
         * prompt and reply */
        if (i)
            cr_expect_gt(input[i], input[i - 1] + usage(j, "output_tokens") / 2,
                         "turn %d's prompt (%lld tokens) does not hold turn %d's (%lld)", i + 1,
                         (long long)input[i], i, (long long)input[i - 1]);
        /* after a restart the chain's session is read back from its snapshot: the
         * history is cached, not prefilled again */
        if (i == 2 || i == 4)
            cr_expect_gt(json_integer_value(json_object_get(json_object_get(json_object_get(
                             j, "usage"), "input_tokens_details"), "cached_tokens")), 0,
                         "turn %d after the restart found nothing cached", i + 1);
        json_decref(j);
    }
    cr_expect_eq(n_records(), 5);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    start(&d, NULL);
    for (int i = 0; i < 5; i++) {
        json_t *j;
        cr_assert_eq(get(&d, NULL, id[i], &j), 200, "response %d is gone", i + 1);
        cr_expect_str_eq(str(j, "output_text"), text[i], "response %d changed", i + 1);
        json_decref(j);
    }
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(responses, a_streamed_response_is_stored_before_its_last_event)
{
    kvpd_proc d;
    start(&d, NULL);
    char *raw = NULL;
    const char *rb;
    cr_assert_eq(h_request(d.port, "POST", "/v1/responses", NULL, "{\"input\":\"Once\","
                           "\"stream\":true,\"max_output_tokens\":4}", &raw, &rb), 200);
    const char *p = strstr(rb, "\"id\":\"resp_");
    cr_assert(p, "%s", rb);
    char id[64];
    snprintf(id, sizeof id, "%.29s", p + 6);
    cr_expect(strstr(rb, "response.incomplete") || strstr(rb, "response.completed"), "%s", rb);
    free(raw);
    kvpd_kill(&d);   /* no clean stop: the record was written before the stream ended */
    start(&d, NULL);
    cr_expect_eq(get(&d, NULL, id, NULL), 200, "the streamed response %s was lost", id);
    json_decref(turn(&d, NULL, " Next", id, NULL));
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(responses, another_tenant_gets_404_and_delete_is_for_good)
{
    kvpd_proc d;
    start(&d, "--api-key key-a,key-b");
    json_t *j = turn(&d, KA, "Once upon a time", NULL, NULL);
    char id[64];
    snprintf(id, sizeof id, "%s", str(j, "id"));
    json_decref(j);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    start(&d, "--api-key key-a,key-b");
    cr_expect_eq(get(&d, KB, id, NULL), 404, "another tenant read A's response");
    cr_expect_eq(del(&d, KB, id), 404, "another tenant deleted A's response");
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", id);
    cr_expect_eq(call(&d, "POST", "/v1/responses", KB, body, &j), 400);
    cr_expect_str_eq(json_string_value(json_object_get(json_object_get(j, "error"), "param")),
                     "previous_response_id");
    json_decref(j);
    cr_expect_eq(get(&d, KA, id, NULL), 200, "B's attempts removed A's response");
    cr_expect_eq(n_records(), 1);
    cr_expect_eq(del(&d, KA, id), 200);
    cr_expect_eq(n_records(), 0, "DELETE left the record on disk");
    cr_expect_eq(get(&d, KA, id, NULL), 404);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    start(&d, "--api-key key-a,key-b");
    cr_expect_eq(get(&d, KA, id, NULL), 404, "a deleted response came back after a restart");
    cr_expect_eq(del(&d, KA, id), 404);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(responses, store_false_keeps_no_record)
{
    kvpd_proc d;
    start(&d, NULL);
    json_t *j = turn(&d, NULL, "Once upon a time", NULL, ",\"store\":false");
    char id[64];
    snprintf(id, sizeof id, "%s", str(j, "id"));
    cr_expect(json_is_false(json_object_get(j, "store")));
    json_decref(j);
    cr_expect_eq(n_records(), 0, "store:false wrote a record");
    cr_expect_eq(get(&d, NULL, id, NULL), 404);
    /* a stored one beside it is written: the count above could see one */
    json_decref(turn(&d, NULL, "Once upon a time", NULL, NULL));
    cr_expect_eq(n_records(), 1);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* Every file under dir with its size and modification time, one a line, sorted, into
 * out (a listing to compare: a file written, added or removed changes it). */
static int line_cmp(const void *a, const void *b)
{
    return strcmp(*(char *const *)a, *(char *const *)b);
}

static void list_dir(const char *dir, const char *rel, char **lines, int *n, int max)
{
    char path[512];
    snprintf(path, sizeof path, "%s%s", dir, rel);
    DIR *d = opendir(path);
    cr_assert(d, "%s", path);
    for (struct dirent *e; (e = readdir(d));) {
        if (!strcmp(e->d_name, ".") || !strcmp(e->d_name, ".."))
            continue;
        char sub[512], full[1024];
        snprintf(sub, sizeof sub, "%s/%s", rel, e->d_name);
        snprintf(full, sizeof full, "%s%s", dir, sub);
        struct stat st;
        cr_assert_eq(lstat(full, &st), 0, "%s", full);
        if (S_ISDIR(st.st_mode)) {
            list_dir(dir, sub, lines, n, max);
            continue;
        }
        cr_assert_lt(*n, max);
        char line[700];
        snprintf(line, sizeof line, "%s %lld %lld.%09ld", sub, (long long)st.st_size,
                 (long long)st.st_mtim.tv_sec, st.st_mtim.tv_nsec);
        lines[(*n)++] = strdup(line);
    }
    closedir(d);
}

static void listing(const char *dir, char *out, size_t n)
{
    char *lines[256];
    int k = 0;
    list_dir(dir, "", lines, &k, 256);
    qsort(lines, (size_t)k, sizeof *lines, line_cmp);
    size_t at = 0;
    out[0] = '\0';
    for (int i = 0; i < k; i++) {
        at += (size_t)snprintf(out + at, at < n ? n - at : 0, "%s\n", lines[i]);
        free(lines[i]);
    }
    cr_assert_lt(at, n, "the listing of %s is too long", dir);
}

/* The sessions /admin/stats lists, as "id turns" lines. */
static void sessions_listed(const kvpd_proc *d, char *out, size_t n)
{
    json_t *st = h_stats(d);
    cr_assert(st);
    json_t *list = json_object_get(st, "session_list"), *e;
    size_t i, at = 0;
    out[0] = '\0';
    json_array_foreach(list, i, e)
        at += (size_t)snprintf(out + at, at < n ? n - at : 0, "%s %lld\n", str(e, "id"),
                               (long long)json_integer_value(json_object_get(e, "turns")));
    cr_assert_lt(at, n);
    json_decref(st);
}

static const char *kvpd_session(json_t *j)
{
    return str(json_object_get(j, "kvpd"), "session");
}

/* Waits (at most 30 s) until dir holds want transcripts. */
static void await_transcripts(const char *dir, int want)
{
    double end = kvp_now() + 30;
    while (h_count_files(dir, ".kvtx") < want) {
        cr_assert_lt(kvp_now(), end, "%s holds %d transcripts, not %d", dir,
                     h_count_files(dir, ".kvtx"), want);
        usleep(20000);
    }
}

Test(responses, store_false_keeps_nothing_and_leaves_the_chain_as_it_was)
{
    char learn[64], args[160], tdir[128];
    cr_assert_eq(h_mkdtemp(learn, sizeof learn), 0);
    snprintf(tdir, sizeof tdir, "%s/default", learn);
    snprintf(args, sizeof args, "--learn-dir %s --learn-rate 1", learn);
    kvpd_proc d;
    start(&d, args);
    const char *greedy = ",\"temperature\":0";
    json_t *a = turn(&d, NULL, "Once upon a time", NULL, greedy);
    char ida[64], sa[64];
    snprintf(ida, sizeof ida, "%s", str(a, "id"));
    cr_assert(kvpd_session(a));
    snprintf(sa, sizeof sa, "%s", kvpd_session(a));
    json_int_t a_input = usage(a, "input_tokens");
    json_decref(a);
    /* the reference: the chain's next turn as it is before any store:false turn */
    json_t *x1 = turn(&d, NULL, " Then the sun", ida, greedy);
    await_transcripts(tdir, 1);
    char state0[16384], state1[16384], list0[4096], list1[4096];
    listing(g_dir, state0, sizeof state0);
    sessions_listed(&d, list0, sizeof list0);
    cr_assert(strstr(list0, sa), "%s", list0);

    /* a new conversation, and one continuing the stored chain, neither kept */
    json_t *f1 = turn(&d, NULL, "A purple elephant", NULL, ",\"store\":false");
    json_t *f2 = turn(&d, NULL, " A purple elephant sang", ida, ",\"store\":false");
    json_t *f[2] = {f1, f2};
    for (int i = 0; i < 2; i++) {
        cr_expect(json_is_false(json_object_get(f[i], "store")));
        cr_expect(!kvpd_session(f[i]), "store:false response %d names session %s", i + 1,
                  kvpd_session(f[i]));
        cr_expect(json_is_null(json_object_get(json_object_get(f[i], "kvpd"), "durable")),
                  "store:false response %d says it is durable", i + 1);
        cr_expect_eq(get(&d, NULL, str(f[i], "id"), NULL), 404);
    }
    /* f2's prompt is the chain's conversation and its input; what the chain's session
     * cached served it (a fork, not a prefill of the whole conversation) */
    cr_expect_gt(usage(f2, "input_tokens"), a_input);
    cr_expect_gt(json_integer_value(json_object_get(json_object_get(json_object_get(
                     f2, "usage"), "input_tokens_details"), "cached_tokens")),
                 0, "the store:false continuation prefilled the whole chain");
    listing(g_dir, state1, sizeof state1);
    cr_expect_str_eq(state1, state0, "store:false changed the state directory");
    sessions_listed(&d, list1, sizeof list1);
    cr_expect_str_eq(list1, list0, "store:false left a session or changed one");
    cr_expect_eq(n_records(), 2);

    /* the chain goes on as if the store:false turn had never been: the same prompt, the
     * same (greedy) reply, in the chain's own session */
    json_t *x2 = turn(&d, NULL, " Then the sun", ida, greedy);
    cr_expect_eq(usage(x2, "input_tokens"), usage(x1, "input_tokens"),
                 "the chain's prompt changed after a store:false turn");
    cr_expect_str_eq(str(x2, "output_text"), str(x1, "output_text"));
    cr_expect_str_eq(kvpd_session(x2) ? kvpd_session(x2) : "", sa);

    /* learn_dir: a stored conversation after them is kept, they are not (the queue
     * writes in order: theirs would be there first) */
    json_decref(turn(&d, NULL, "A cat sat", NULL, NULL));
    await_transcripts(tdir, 2);
    usleep(300000);
    cr_expect_eq(h_count_files(tdir, ".kvtx"), 2, "a store:false turn reached learn_dir");
    json_decref(x1);
    json_decref(x2);
    json_decref(f1);
    json_decref(f2);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(learn);
}

Test(responses, the_bounds_hold_across_a_restart)
{
    kvpd_proc d;
    const char *bound = "--api-key key-a,key-b --max-stored-responses-per-tenant 3";
    start(&d, bound);
    char a[4][64], b[64];
    for (int i = 0; i < 3; i++) {
        json_t *j = turn(&d, KA, "x", NULL, NULL);
        snprintf(a[i], sizeof a[i], "%s", str(j, "id"));
        json_decref(j);
    }
    json_t *j = turn(&d, KB, "y", NULL, NULL);
    snprintf(b, sizeof b, "%s", str(j, "id"));
    json_decref(j);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    start(&d, bound);
    j = turn(&d, KA, "x", a[2], NULL);   /* A's fourth: its oldest goes */
    snprintf(a[3], sizeof a[3], "%s", str(j, "id"));
    json_decref(j);
    cr_expect_eq(get(&d, KA, a[0], NULL), 404, "A's oldest was kept past its bound");
    for (int i = 1; i < 4; i++)
        cr_expect_eq(get(&d, KA, a[i], NULL), 200, "A's response %d", i);
    cr_expect_eq(get(&d, KB, b, NULL), 200, "A's bound dropped B's response");
    cr_expect_eq(n_records(), 4);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

static void record_path(char *path, size_t n, const char *id)
{
    snprintf(path, n, "%s/responses/%s.resp", g_dir, id);
}

Test(responses, damaged_records_are_refused_with_a_log_line_and_a_404)
{
    kvpd_proc d;
    start(&d, NULL);
    char id[3][64];
    for (int i = 0; i < 3; i++) {
        json_t *j = turn(&d, NULL, "Once upon a time", NULL, NULL);
        snprintf(id[i], sizeof id[i], "%s", str(j, "id"));
        json_decref(j);
    }
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    char path[256];
    record_path(path, sizeof path, id[0]);   /* cut in its payload */
    cr_assert_eq(truncate(path, 100), 0);
    record_path(path, sizeof path, id[1]);   /* framed and checksummed, but not a record */
    size_t n;
    unsigned char *rec = kvp_resp_encode("", id[1], "{\"items\":7}", 11, &n);
    FILE *f = fopen(path, "wb");
    cr_assert(f && rec);
    cr_assert_eq(fwrite(rec, 1, n, f), n);
    fclose(f);
    free(rec);
    start(&d, NULL);
    json_t *j;
    cr_expect_eq(get(&d, NULL, id[0], &j), 404);
    json_decref(j);
    cr_expect(kvpd_log_has(&d, "truncated payload"), "no log line for the truncated record "
              "(log %s)", d.log);
    char body[256];
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", id[1]);
    cr_expect_eq(call(&d, "POST", "/v1/responses", NULL, body, NULL), 400);
    cr_expect(kvpd_log_has(&d, "damaged record refused"), "log %s", d.log);
    cr_expect_eq(get(&d, NULL, id[1], NULL), 404);
    /* the good one, and the daemon, go on */
    cr_expect_eq(get(&d, NULL, id[2], NULL), 200);
    json_decref(turn(&d, NULL, " Then", id[2], NULL));
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(responses, hostile_ids_are_refused_naming_the_problem)
{
    kvpd_proc d;
    start(&d, NULL);
    char longid[400] = "resp_";
    memset(longid + 5, 'a', 300);
    static const char *const bad[] = {"resp_..%2F..%2Fx", "..", "resp_../../etc",
                                      "resp_0123456789abcdef0123456", "resp_%2e%2e"};
    json_t *j;
    for (size_t i = 0; i < sizeof bad / sizeof *bad + 1; i++) {
        const char *id = i < sizeof bad / sizeof *bad ? bad[i] : longid;
        int status = get(&d, NULL, id, &j);
        cr_expect_eq(status, 404, "GET %s: %d", id, status);
        const char *msg = json_string_value(json_object_get(json_object_get(j, "error"),
                                                            "message"));
        cr_expect(!msg || strstr(msg, "response id") || strstr(msg, "no stored response") ||
                  strstr(msg, "no such endpoint"), "GET %.40s: %s", id, msg);
        json_decref(j);
        cr_expect_eq(del(&d, NULL, id), 404, "DELETE %.40s", id);
    }
    cr_expect_eq(get(&d, NULL, longid, &j), 404);
    cr_expect(strstr(json_string_value(json_object_get(json_object_get(j, "error"), "message")),
                     "not a response id"), "the over-long id's message");
    json_decref(j);
    static const struct { const char *prev, *says; } prevs[] = {
        {"7", "must be a string"}, {"{}", "must be a string"}, {"[\"resp_x\"]", "must be a string"},
        {"true", "must be a string"}, {"\"../../etc/passwd\"", "not a response id"},
        {"\"resp_000000000000000000000000\"", "no stored response"}};
    for (size_t i = 0; i < sizeof prevs / sizeof *prevs; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":%s}", prevs[i].prev);
        cr_expect_eq(call(&d, "POST", "/v1/responses", NULL, body, &j), 400, "%s", body);
        json_t *e = json_object_get(j, "error");
        cr_expect_str_eq(json_string_value(json_object_get(e, "param")), "previous_response_id");
        const char *msg = json_string_value(json_object_get(e, "message"));
        cr_expect(msg && strstr(msg, prevs[i].says), "%s: %s", body, msg);
        json_decref(j);
    }
    char body[700];
    snprintf(body, sizeof body, "{\"input\":\"x\",\"previous_response_id\":\"%s\"}", longid);
    cr_expect_eq(call(&d, "POST", "/v1/responses", NULL, body, NULL), 400);
    cr_expect_eq(n_records(), 0);
    json_decref(turn(&d, NULL, "still serving", NULL, NULL));
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
