/* A flood of one-shot API conversations under one key must not fill the state
 * directory: past max_state_bytes_per_tenant that key's own least recently used parked
 * snapshots are deleted, never another key's, nor one of a session in memory or
 * attached, so a named conversation of another key still resumes after a restart. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/daemon/harness.h"
#include "tests/security/seclib.h"

TestSuite(security_disk_flood, .timeout = 300);

#define KA "Authorization: Bearer key-a\r\n"
#define KB "Authorization: Bearer key-b\r\n"
#define FLOOD 100
#define BOUND (64 * 1024)
#define MAX_SESSIONS 8

/* The bytes of the snapshots and journals in dir, their count and the largest file. */
static long long state_bytes(const char *dir, int *snaps, long long *largest)
{
    DIR *d = opendir(dir);
    cr_assert(d, "open %s", dir);
    long long total = 0;
    *snaps = 0;
    *largest = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        int snap = n > 5 && !strcmp(e->d_name + n - 5, ".snap");
        int journal = n > 8 && !strcmp(e->d_name + n - 8, ".journal");
        if (!snap && !journal)
            continue;
        char path[512];
        struct stat sb;
        snprintf(path, sizeof path, "%s/%s", dir, e->d_name);
        if (stat(path, &sb) != 0)
            continue;
        total += sb.st_size;
        if (sb.st_size > *largest)
            *largest = sb.st_size;
        *snaps += snap;
    }
    closedir(d);
    return total;
}

static int has_snapshot(const char *dir, const char *id)
{
    char path[512];
    struct stat sb;
    snprintf(path, sizeof path, "%s/%s.snap", dir, id);
    return stat(path, &sb) == 0;
}

Test(security_disk_flood, a_flood_of_one_key_stays_within_its_bytes_and_the_other_key_resumes)
{
    char dir[64], args[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--api-key key-a,key-b --max-sessions %d "
             "--max-state-bytes-per-tenant %d --state-dir %s", MAX_SESSIONS, BOUND, dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);

    /* B's named conversation, then A's websocket session that stays attached. */
    sec_answer b = sec_post(&d, KB, SEC_FIRST);
    cr_assert_eq(b.status, 200, "%s", b.raw);
    ws_client ws;
    cr_assert_eq(ws_connect_headers(&ws, "127.0.0.1", d.port, "/chat", KA, 5000), 0);
    cr_assert_eq(ws_send_text(&ws, "{\"type\":\"hello\"}"), 0);
    json_t *sess = h_expect(&ws, "session", 5000);
    cr_assert(sess, "no session event");
    char attached[80];
    snprintf(attached, sizeof attached, "%s", json_string_value(json_object_get(sess, "id")));
    json_decref(sess);
    json_t *done = h_turn(&ws, "A frog sat on a log.", 2, NULL);
    cr_assert(done);
    cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
    json_decref(done);

    char first_id[64] = "", first_reply[512] = "";
    sec_answer a = sec_flood_post(&d, KA, 0);
    snprintf(first_id, sizeof first_id, "%s", a.session);
    snprintf(first_reply, sizeof first_reply, "%s", a.reply);
    sec_answer_free(&a);
    sec_flood(&d, KA, 1, FLOOD);
    /* A snapshot just written counts as live until the hub's next list of its sessions
     * (once a second): the next write after it brings the key within its bound. */
    usleep(1500 * 1000);
    sec_answer last = sec_post(&d, KA, SEC_FIRST);
    cr_assert_eq(last.status, 200, "%s", last.raw);
    sec_answer_free(&last);
    int snaps;
    long long largest, total = state_bytes(dir, &snaps, &largest);
    /* A's bytes within the bound, plus what may not go: its sessions still in memory
     * (at most max_sessions, one of them the attached one) and B's conversation. */
    long long allowed = BOUND + (long long)(MAX_SESSIONS + 1) * largest;
    cr_assert_gt(largest * FLOOD, 2 * allowed, "the flood's snapshots are too small (%lld "
                 "bytes) to tell a bound from none", largest);
    cr_assert_leq(total, allowed, "%d snapshots of %lld bytes in the state dir after %d "
                  "one-shot conversations (largest file %lld)", snaps, total, FLOOD, largest);
    cr_assert_lt(snaps, FLOOD / 2, "%d snapshots kept", snaps);
    cr_assert(has_snapshot(dir, b.session), "the other key's conversation was deleted");
    cr_assert(has_snapshot(dir, attached), "the attached session's snapshot was deleted");
    cr_assert(kvpd_log_has(&d, "max_state_bytes_per_tenant"), "no log line names the bound");
    char *metrics = NULL;
    cr_assert_eq(h_get(&d, "/metrics", NULL, &metrics), 200);
    double deleted = h_metric(metrics, "kvpd_snapshots_over_quota_total");
    free(metrics);
    cr_assert_geq(deleted, FLOOD - snaps, "kvpd_snapshots_over_quota_total %.0f", deleted);

    /* A's first conversation lost its snapshot: extending it starts a new one. */
    cr_assert(!has_snapshot(dir, first_id), "the key's oldest snapshot stayed");
    json_t *req = json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}], s:i}", "messages",
                            "role", "user", "content", "Story 0: a frog.", "role",
                            "assistant", "content", first_reply, "role", "user", "content",
                            "Then?", "max_tokens", 2);
    char *again = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    sec_answer a0 = sec_post(&d, KA, again);
    free(again);
    cr_assert_eq(a0.status, 200, "%s", a0.raw);
    cr_assert_str_neq(a0.session, first_id);
    sec_answer_free(&a0);

    /* The attached session takes another turn. */
    h_turn_ok(&ws, "Then it jumped.", 2);
    ws_close(&ws);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);

    /* After a restart B's conversation resumes from its snapshot, cache included. */
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    sec_assert_resumes(&d, KB, &b, 1, "B's conversation after the restart");
    sec_answer_free(&b);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(dir);
}

/* The bound is counted from the files at start too: a directory already over it is
 * brought within it by the key's next write, the other key's snapshot kept. */
Test(security_disk_flood, the_bound_counts_the_snapshots_already_on_disk)
{
    char dir[64], args[256], bounded[320];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--api-key key-a,key-b --max-sessions %d "
             "--max-state-bytes-per-tenant 0 --state-dir %s", MAX_SESSIONS, dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    sec_answer b = sec_post(&d, KB, SEC_FIRST);
    cr_assert_eq(b.status, 200, "%s", b.raw);
    for (int i = 0; i < 40; i++) {
        char body[160];
        snprintf(body, sizeof body, "{\"messages\":[{\"role\":\"user\",\"content\":\"Tale %d: "
                 "a cat.\"}],\"max_tokens\":2}", i);
        sec_answer a = sec_post(&d, KA, body);
        cr_assert_eq(a.status, 200, "%s", a.raw);
        sec_answer_free(&a);
    }
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    int before, after;
    long long largest;
    state_bytes(dir, &before, &largest);
    cr_assert_geq(before, 41, "with no bound every snapshot stays (%d)", before);

    snprintf(bounded, sizeof bounded, "--api-key key-a,key-b --max-sessions %d "
             "--max-state-bytes-per-tenant %d --state-dir %s", MAX_SESSIONS, BOUND, dir);
    cr_assert_eq(kvpd_start(&d, bounded), 0, "log %s", d.log);
    usleep(1500 * 1000);   /* the hub's first list of its sessions */
    sec_answer a = sec_post(&d, KA, SEC_FIRST);
    cr_assert_eq(a.status, 200, "%s", a.raw);
    sec_answer_free(&a);
    long long total = state_bytes(dir, &after, &largest);
    cr_assert_leq(total, BOUND + 2 * largest, "%lld bytes in %d snapshots", total, after);
    cr_assert(has_snapshot(dir, b.session), "the other key's conversation was deleted");
    sec_answer_free(&b);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(dir);
}
