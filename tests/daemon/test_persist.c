/* Integration: session snapshots across restarts, kill -9, damaged files, identity
 * changes, the idle timeout's parking and SIGTERM's drain, against a live kvpd. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

H_STATE_DIR_SUITE(persist, .timeout = 90);

static void start(kvpd_proc *p, const char *extra)
{
    char args[1024];
    snprintf(args, sizeof args, "--state-dir %s %s", g_dir, extra ? extra : "");
    cr_assert_eq(kvpd_start(p, args), 0, "kvpd did not start (log %s)", p->log);
}

static void stop(kvpd_proc *p)
{
    cr_assert_eq(kvpd_stop(p, 10000), 0, "kvpd did not exit 0 on SIGTERM");
}

static json_int_t stat_of(json_t *done, const char *key)
{
    json_t *v = json_object_get(json_object_get(done, "stats"), key);
    cr_assert(json_is_integer(v), "stats.%s missing", key);
    return json_integer_value(v);
}

static const char *str_of(json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

/* A new session over c; its id into id. */
static void new_session(ws_client *c, char *id)
{
    cr_assert_eq(ws_send_text(c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(c, "session", 5000);
    cr_assert(s);
    snprintf(id, 64, "%s", str_of(s, "id"));
    json_decref(s);
}

/* hello with id: the session frame, or the error frame. */
static json_t *hello(ws_client *c, const char *id)
{
    char msg[128];
    snprintf(msg, sizeof msg, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(ws_send_text(c, msg), 0);
    for (;;) {
        json_t *j = h_read_json(c, 10000);
        cr_assert(j, "no answer to hello");
        const char *t = str_of(j, "type");
        if (!strcmp(t, "session") || !strcmp(t, "error"))
            return j;
        json_decref(j);
    }
}

static json_t *turn_ok(ws_client *c, const char *text, int max_tokens)
{
    json_t *done = h_turn(c, text, max_tokens, NULL);
    cr_assert(done, "no answer to '%s'", text);
    cr_assert_str_eq(str_of(done, "type"), "done", "%s: %s", str_of(done, "code"),
                     str_of(done, "message"));
    return done;
}

static void snap_path(char *buf, size_t n, const char *id, const char *suffix)
{
    snprintf(buf, n, "%s/%s.snap%s", g_dir, id, suffix);
}

static int count_files(const char *prefix)
{
    DIR *d = opendir(g_dir);
    cr_assert(d);
    int n = 0;
    struct dirent *e;
    while ((e = readdir(d)))
        n += !strncmp(e->d_name, prefix, strlen(prefix));
    closedir(d);
    return n;
}

/* Sends a long-reply message and reads until `tokens` token frames came (returns 1: the
 * turn is still running) or its done (returns 0: the reply ended early; try again). */
static int long_turn_running(ws_client *c, int tokens)
{
    cr_assert_eq(ws_send_text(c, "{\"type\":\"message\",\"text\":\"Tell me a long story.\","
                                 "\"max_tokens\":100000}"), 0);
    for (int got = 0; got < tokens;) {
        json_t *j = h_read_json(c, 10000);
        cr_assert(j, "no frame from the long turn");
        const char *t = str_of(j, "type");
        got += !strcmp(t, "token");
        int done = !strcmp(t, "done");
        cr_assert(done || !strcmp(t, "token") || !strcmp(t, "session"), "unexpected %s", t);
        json_decref(j);
        if (done)
            return 0;
    }
    return 1;
}

static const char *lines[] = {"Once upon a time, there was a little dog.",
                              "The dog liked to play in the park.",
                              "One day, it saw a big red ball."};

Test(persist, restart_resumes_and_prefills_only_the_new_tokens)
{
    kvpd_proc d;
    start(&d, NULL);
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&d, &c), 0);
    new_session(&c, id);
    for (int i = 0; i < 2; i++)
        json_decref(turn_ok(&c, lines[i], 16));
    ws_close(&c);
    char path[256];
    snap_path(path, sizeof path, id, "");
    cr_assert_eq(access(path, F_OK), 0, "no snapshot %s after two turns", path);
    stop(&d);

    start(&d, NULL);
    cr_assert_eq(h_connect(&d, &c), 0);
    json_t *s = hello(&c, id);
    cr_assert_str_eq(str_of(s, "type"), "session", "%s", str_of(s, "message"));
    cr_assert_str_eq(str_of(s, "id"), id);
    cr_assert(json_is_true(json_object_get(s, "resumed")));
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 2);
    json_t *hist = json_object_get(s, "history");
    cr_assert_eq(json_array_size(hist), 4);
    cr_assert_str_eq(str_of(json_array_get(hist, 0), "text"), lines[0]);
    cr_assert_str_eq(str_of(json_array_get(hist, 2), "text"), lines[1]);
    json_decref(s);
    json_t *resumed = turn_ok(&c, lines[2], 16);
    json_int_t prompt = stat_of(resumed, "prompt_tokens");
    cr_assert_eq(stat_of(resumed, "prefilled_tokens"), prompt,
                 "after a restart, prefill must be the new tokens only");
    cr_assert_lt(prompt, 20, "%lld new tokens for one line", (long long)prompt);
    cr_assert_lt(prompt, stat_of(resumed, "transcript_tokens") / 2);
    ws_close(&c);

    /* The same three turns without a restart give the same reply: the cache came back
     * exactly (greedy decoding). */
    ws_client r;
    char rid[64];
    cr_assert_eq(h_connect(&d, &r), 0);
    new_session(&r, rid);
    for (int i = 0; i < 2; i++)
        json_decref(turn_ok(&r, lines[i], 16));
    json_t *ref = turn_ok(&r, lines[2], 16);
    cr_assert_str_eq(str_of(resumed, "reply"), str_of(ref, "reply"));
    cr_assert_eq(stat_of(resumed, "transcript_tokens"), stat_of(ref, "transcript_tokens"));
    json_decref(ref);
    json_decref(resumed);
    ws_close(&r);
    stop(&d);
}

Test(persist, kill_9_during_generation_loses_at_most_the_turn_in_flight)
{
    kvpd_proc d;
    start(&d, "--max-tokens 100000 --temperature 0.9");
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&d, &c), 0);
    new_session(&c, id);
    json_decref(turn_ok(&c, lines[0], 8));
    /* A long reply at a high temperature, killed after a few of its tokens (should the
     * model end a reply that early, the next one is). */
    int completed = 1, running = 0;
    for (int attempt = 0; attempt < 5 && !running; attempt++) {
        running = long_turn_running(&c, 20);
        completed += !running;
    }
    cr_assert(running, "no reply ran long enough to be killed");
    kvpd_kill(&d);
    ws_close(&c);

    start(&d, NULL);
    cr_assert_eq(h_connect(&d, &c), 0);
    json_t *s = hello(&c, id);
    cr_assert_str_eq(str_of(s, "type"), "session", "%s", str_of(s, "message"));
    /* The completed turns survive; the killed one may have finished writing or not. */
    json_int_t turns = json_integer_value(json_object_get(s, "turns"));
    cr_assert(turns == completed || turns == completed + 1, "turns %lld, %d completed",
              (long long)turns, completed);
    cr_assert_eq(json_array_size(json_object_get(s, "history")), (size_t)(2 * turns));
    json_decref(s);
    json_t *next = turn_ok(&c, lines[1], 8);
    cr_assert_eq(stat_of(next, "prefilled_tokens"), stat_of(next, "prompt_tokens"));
    cr_assert_lt(stat_of(next, "prompt_tokens"), 20);
    json_decref(next);
    ws_close(&c);
    stop(&d);
    /* Only the session's state is left: its snapshot and, for the turns since, its
     * journal; no temporary file ("." and ".." are counted too). */
    char mine[80];
    snprintf(mine, sizeof mine, "%s.snap", id);
    cr_assert_eq(count_files(mine), 1, "the session's snapshot is missing or has a .tmp");
    /* and the transcript index (docs/openai.md), without its temporary file */
    cr_assert_eq(count_files("transcripts.index"), 1, "no transcript index, or its .tmp is left");
    /* and the prefix index (docs/architecture.md), without its temporary file */
    cr_assert_eq(count_files("prefix.index"), 1, "no prefix index, or its .tmp is left");
    /* and the state dir's lock, kept (with the last holder's pid) after the daemon */
    cr_assert_eq(count_files("kvpd.lock"), 1, "no state dir lock");
    cr_assert_eq(count_files("") - 5, count_files(id), "files not of the session are left");
    cr_assert_leq(count_files(id), 2);
}

/* Damages the session's snapshot with f, restarts, and expects it refused, reported
 * and moved aside while the daemon goes on serving. */
static void damaged_snapshot_is_refused(void (*damage)(const char *path))
{
    kvpd_proc d;
    start(&d, NULL);
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&d, &c), 0);
    new_session(&c, id);
    json_decref(turn_ok(&c, lines[0], 8));
    ws_close(&c);
    stop(&d);
    char path[256];
    snap_path(path, sizeof path, id, "");
    damage(path);

    start(&d, NULL);
    cr_assert_eq(h_connect(&d, &c), 0);
    json_t *e = hello(&c, id);
    cr_assert_str_eq(str_of(e, "type"), "error");
    cr_assert_str_eq(str_of(e, "code"), "unknown_session");
    json_decref(e);
    cr_assert(kvpd_log_has(&d, "moved aside"), "the log does not report the bad snapshot");
    cr_assert_neq(access(path, F_OK), 0, "the bad snapshot is still in place");
    char prefix[80];
    snprintf(prefix, sizeof prefix, "%s.snap.bad-", id);
    cr_assert_eq(count_files(prefix), 1);
    /* Asked again: still unknown, and nothing more is moved. */
    e = hello(&c, id);
    cr_assert_str_eq(str_of(e, "code"), "unknown_session");
    json_decref(e);
    cr_assert_eq(count_files(prefix), 1);
    char nid[64];
    new_session(&c, nid);
    json_decref(turn_ok(&c, lines[1], 8));
    json_t *st = h_stats(&d);
    cr_assert(st);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(st, "persistence"), "lost")), 1);
    json_decref(st);
    ws_close(&c);
    stop(&d);
}

static void flip_one_byte(const char *path)
{
    int fd = open(path, O_RDWR);
    cr_assert_geq(fd, 0);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    off_t at = st.st_size / 2;
    unsigned char b;
    cr_assert_eq(pread(fd, &b, 1, at), 1);
    b ^= 0x01;
    cr_assert_eq(pwrite(fd, &b, 1, at), 1);
    close(fd);
}

static void truncate_half(const char *path)
{
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_eq(truncate(path, st.st_size / 2), 0);
}

Test(persist, a_snapshot_altered_by_one_byte_is_refused)
{
    damaged_snapshot_is_refused(flip_one_byte);
}

Test(persist, a_truncated_snapshot_is_refused)
{
    damaged_snapshot_is_refused(truncate_half);
}

/* Restarted under `extra`: the session is rebuilt from its transcript, so its next
 * turn prefills the whole conversation. */
static void rebuilt_after_restart_with(const char *extra)
{
    kvpd_proc d;
    start(&d, NULL);
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&d, &c), 0);
    new_session(&c, id);
    json_t *first = turn_ok(&c, lines[0], 16);
    json_int_t transcript = stat_of(first, "transcript_tokens");
    json_decref(first);
    ws_close(&c);
    stop(&d);

    start(&d, extra);
    cr_assert_eq(h_connect(&d, &c), 0);
    json_t *s = hello(&c, id);
    cr_assert_str_eq(str_of(s, "type"), "session");
    cr_assert(json_is_true(json_object_get(s, "resumed")));
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 1);
    cr_assert_eq(json_array_size(json_object_get(s, "history")), 2);
    json_decref(s);
    json_t *next = turn_ok(&c, lines[1], 8);
    json_int_t prefilled = stat_of(next, "prefilled_tokens");
    json_int_t now = stat_of(next, "transcript_tokens") - stat_of(next, "generated_tokens");
    cr_assert_eq(prefilled, now, "prefilled %lld, want the whole transcript %lld",
                 (long long)prefilled, (long long)now);
    cr_assert_gt(prefilled, transcript / 2);
    cr_assert_eq(stat_of(next, "prompt_tokens"), prefilled);
    json_decref(next);
    cr_assert(kvpd_log_has(&d, "rebuilt from its transcript"));
    /* Its new snapshot is under the new identity: the turn after is incremental. */
    next = turn_ok(&c, lines[2], 8);
    cr_assert_lt(stat_of(next, "prefilled_tokens"), 20);
    json_decref(next);
    ws_close(&c);
    stop(&d);
}

Test(persist, another_policy_rebuilds_from_the_transcript)
{
    rebuilt_after_restart_with("--policy h2o");
}

Test(persist, another_model_rebuilds_from_the_transcript)
{
    char extra[1200];
    snprintf(extra, sizeof extra, "--model %s", h_shared("models/stories260K.gguf"));
    rebuilt_after_restart_with(extra);
}

static double metric(const kvpd_proc *d, const char *name)
{
    char *body = NULL;
    cr_assert_eq(h_get(d, "/metrics", NULL, &body), 200);
    double v = h_metric(body, name);
    free(body);
    return v;
}

Test(persist, the_idle_timeout_parks_and_a_message_brings_the_session_back)
{
    kvpd_proc d;
    start(&d, "--idle-timeout 1");
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&d, &c), 0);
    new_session(&c, id);
    json_decref(turn_ok(&c, lines[0], 16));
    int parked = 0;
    for (int i = 0; i < 100 && !parked; i++) {
        parked = metric(&d, "kvpd_sessions_parked") == 1;
        if (!parked)
            nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    }
    cr_assert(parked, "the idle session was not parked");
    cr_assert_eq(metric(&d, "kvpd_sessions_resident"), 0);
    cr_assert_eq(metric(&d, "kvpd_cache_bytes"), 0);
    cr_assert_eq(metric(&d, "kvpd_parks_total"), 1);
    /* No expiry notice: the attached client just goes on. */
    json_t *next = turn_ok(&c, lines[1], 8);
    cr_assert_eq(stat_of(next, "prefilled_tokens"), stat_of(next, "prompt_tokens"));
    cr_assert_lt(stat_of(next, "prompt_tokens"), 20);
    json_decref(next);
    cr_assert_eq(metric(&d, "kvpd_unparks_total"), 1);
    cr_assert_eq(metric(&d, "kvpd_sessions_resident"), 1);
    ws_close(&c);
    stop(&d);
}

Test(persist, a_parked_session_resumes_on_hello_with_its_history)
{
    kvpd_proc d;
    start(&d, "--idle-timeout 1");
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&d, &c), 0);
    new_session(&c, id);
    json_decref(turn_ok(&c, lines[0], 16));
    ws_close(&c);
    for (int i = 0; i < 100 && metric(&d, "kvpd_sessions_parked") != 1; i++)
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    cr_assert_eq(metric(&d, "kvpd_sessions_parked"), 1);
    cr_assert_eq(h_connect(&d, &c), 0);
    json_t *s = hello(&c, id);
    cr_assert_str_eq(str_of(s, "type"), "session");
    cr_assert(json_is_true(json_object_get(s, "resumed")));
    cr_assert_eq(json_array_size(json_object_get(s, "history")), 2);
    json_decref(s);
    cr_assert_eq(metric(&d, "kvpd_sessions_parked"), 0);
    ws_close(&c);
    stop(&d);
}

Test(persist, sigterm_mid_turn_snapshots_the_partial_reply)
{
    kvpd_proc d;
    start(&d, "--max-tokens 100000 --temperature 0.9");
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&d, &c), 0);
    new_session(&c, id);
    int completed = 0, running = 0;
    for (int attempt = 0; attempt < 5 && !running; attempt++) {
        running = long_turn_running(&c, 10);
        completed += !running;
    }
    cr_assert(running, "no reply ran long enough to be stopped");
    stop(&d);   /* SIGTERM: the turn is cancelled, its done written, its snapshot too */
    ws_close(&c);
    start(&d, NULL);
    cr_assert_eq(h_connect(&d, &c), 0);
    json_t *s = hello(&c, id);
    cr_assert_str_eq(str_of(s, "type"), "session");
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), completed + 1);
    json_t *reply = json_array_get(json_object_get(s, "history"), 2 * completed + 1);
    cr_assert_gt(strlen(str_of(reply, "text")), 0, "the partial reply was not kept");
    json_decref(s);
    ws_close(&c);
    stop(&d);
}

Test(persist, a_parked_session_whose_snapshot_was_damaged_is_lost_not_loaded)
{
    kvpd_proc d;
    start(&d, "--idle-timeout 1");
    ws_client c;
    char id[64];
    cr_assert_eq(h_connect(&d, &c), 0);
    new_session(&c, id);
    json_decref(turn_ok(&c, lines[0], 16));
    for (int i = 0; i < 100 && metric(&d, "kvpd_sessions_parked") != 1; i++)
        nanosleep(&(struct timespec){0, 50 * 1000 * 1000}, NULL);
    cr_assert_eq(metric(&d, "kvpd_sessions_parked"), 1);
    char path[256];
    snap_path(path, sizeof path, id, "");
    flip_one_byte(path);
    /* Its next message: the worker finds the damage, the client is told. */
    json_t *e = h_turn(&c, lines[1], 8, NULL);
    cr_assert(e);
    cr_assert_str_eq(str_of(e, "type"), "error");
    cr_assert_str_eq(str_of(e, "code"), "unknown_session");
    json_decref(e);
    cr_assert(kvpd_log_has(&d, "moved aside"));
    cr_assert_eq(metric(&d, "kvpd_sessions_lost_total"), 1);
    cr_assert_eq(metric(&d, "kvpd_sessions_parked"), 0);
    /* The connection goes on with a new session. */
    json_t *done = turn_ok(&c, lines[2], 8);
    json_decref(done);
    ws_close(&c);
    stop(&d);
}
