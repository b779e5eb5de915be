/* Integration: the prefix index over conversations that are not resident
 * (sessions/prefix_load.h, store/prefix_file.h). After a restart on the same state
 * directory, a new conversation sharing a saved one's opening (as much as if it had
 * stayed in memory), and a branch of a saved conversation, fork it from its snapshot
 * (read first) and prefill only the rest; a damaged prefix.index is skipped line by line
 * with a log message; a parked conversation is a fork source too; another tenant never
 * reads one; a snapshot damaged or gone costs only the fork; with Redis, a restarted node
 * rebuilds the index from the hints beside the snapshots (hostile ones skipped). Over
 * the OpenAI API (chat completions, not streamed). */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

H_STATE_DIR_SUITE(prefix_restart, .timeout = 120);

/* A long opening of a first user message: well over several blocks of 16 tokens. */
#define OPENING "You are a storyteller. Every story has a little girl named Lily, a big " \
                "red ball, a happy dog, a tall tree in the park and a kind old man who " \
                "sells ice cream. The stories are short and end well, and everybody is " \
                "friends at the end of the day."

static void start(kvpd_proc *p, const char *extra)
{
    char args[512];
    snprintf(args, sizeof args, "--state-dir %s %s", g_dir, extra ? extra : "");
    cr_assert_eq(kvpd_start(p, args), 0, "kvpd did not start (log %s)", p->log);
}

static void stop(kvpd_proc *p)
{
    cr_assert_eq(kvpd_stop(p, 10000), 0, "kvpd did not exit 0 on SIGTERM (log %s)", p->log);
}

typedef struct usage {
    int prompt, completion, cached, prefilled;
    char reply[2048];
} usage;

static long num(json_t *j, const char *a, const char *b)
{
    json_t *v = json_object_get(j, a);
    if (b)
        v = json_object_get(v, b);
    cr_assert(json_is_integer(v), "%s.%s missing", a, b ? b : "");
    return (long)json_integer_value(v);
}

/* One request (headers: whole header lines, or NULL): system text and messages
 * alternating user, assistant, ... */
static usage chat_as(const kvpd_proc *d, const char *headers, const char *system,
                     const char *const *msgs, int n, int max_tokens)
{
    json_t *m = json_array();
    if (system)
        json_array_append_new(m, json_pack("{s:s, s:s}", "role", "system", "content", system));
    for (int i = 0; i < n; i++)
        json_array_append_new(m, json_pack("{s:s, s:s}", "role", i % 2 ? "assistant" : "user",
                                           "content", msgs[i]));
    json_t *req = json_pack("{s:o, s:i}", "messages", m, "max_tokens", max_tokens);
    char *body = json_dumps(req, 0);
    json_decref(req);
    char *raw = NULL;
    const char *rb = NULL;
    int status = h_request(d->port, "POST", "/v1/chat/completions", headers, body, &raw, &rb);
    free(body);
    cr_assert_eq(status, 200, "%s", raw ? raw : "(no answer)");
    json_t *j = json_loads(rb, 0, NULL);
    cr_assert(j, "not JSON: %s", rb);
    json_t *u = json_object_get(j, "usage");
    usage r = {.prompt = (int)num(u, "prompt_tokens", NULL),
               .completion = (int)num(u, "completion_tokens", NULL),
               .cached = (int)num(u, "prompt_tokens_details", "cached_tokens"),
               .prefilled = (int)num(j, "kvpd", "prefilled_tokens")};
    const char *text = json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
    snprintf(r.reply, sizeof r.reply, "%s", text ? text : "");
    json_decref(j);
    free(raw);
    return r;
}

static usage chat(const kvpd_proc *d, const char *system, const char *const *msgs, int n,
                  int max_tokens)
{
    return chat_as(d, NULL, system, msgs, n, max_tokens);
}

static double metric(const kvpd_proc *d, const char *name)
{
    char *body = NULL;
    cr_assert_eq(h_get(d, "/metrics", NULL, &body), 200);
    double v = h_metric(body, name);
    free(body);
    return v;
}

/* The first daemon's conversation: the opening and a question, one turn. */
static usage first_conversation(const kvpd_proc *d)
{
    const char *q[] = {OPENING " Tell me a story about the dog."};
    usage a = chat(d, NULL, q, 1, 8);
    cr_assert_geq(a.prompt, 64, "the opening is not several blocks long (%d tokens)", a.prompt);
    return a;
}

/* A new conversation with the opening and another question: forked from the saved one,
 * only the question prefilled. */
static const char *const SECOND[] = {OPENING " Once upon a time, Lily saw a cat."};

static usage expect_opening_forked(const kvpd_proc *d, int opening_prompt)
{
    usage b = chat(d, NULL, SECOND, 1, 4);
    /* the shared prefix is the opening's rendering: the first prompt but its question */
    cr_assert_geq(b.cached, opening_prompt - 16 - 16,
                  "the opening was not found (cached %d of %d, the first prompt %d; log %s)",
                  b.cached, b.prompt, opening_prompt, d->log);
    cr_assert_lt(b.cached, b.prompt);
    cr_assert_eq(b.prefilled, b.prompt - b.cached, "prefilled %d, prompt %d, cached %d",
                 b.prefilled, b.prompt, b.cached);
    return b;
}

/* The tokens the second conversation shares with the first, as a daemon holding the
 * first in memory finds them (forked from the resident session: the common prefix of
 * their renderings, token by token), in a state directory of its own. */
static int shared_prefix(void)
{
    char dir[128], args[256];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--state-dir %s", dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "kvpd did not start (log %s)", d.log);
    const char *q[] = {OPENING " Tell me a story about the dog."};
    chat(&d, NULL, q, 1, 8);
    usage b = chat(&d, NULL, SECOND, 1, 4);
    stop(&d);
    h_rmdir(dir);
    cr_assert_geq(b.cached, 64, "no reference: the resident fork cached %d", b.cached);
    return b.cached;
}

Test(prefix_restart, a_new_conversation_after_a_restart_forks_the_saved_opening)
{
    kvpd_proc d;
    start(&d, NULL);
    usage a = first_conversation(&d);
    stop(&d);
    struct stat st;
    char path[256];
    snprintf(path, sizeof path, "%s/prefix.index", g_dir);
    cr_assert_eq(stat(path, &st), 0, "no prefix.index in the state directory");
    start(&d, NULL);
    cr_assert(kvpd_log_has(&d, "conversation(s) in the prefix index"), "log %s", d.log);
    double hits = metric(&d, "kvpd_prefix_hits_total");
    usage b = expect_opening_forked(&d, a.prompt);
    cr_assert_eq(metric(&d, "kvpd_prefix_hits_total"), hits + 1);
    cr_assert(kvpd_log_has(&d, "read from its snapshot to be forked"), "log %s", d.log);
    stop(&d);
    /* as much as if the first conversation had stayed in memory */
    int shared = shared_prefix();
    cr_assert_geq(b.cached, shared - 16, "cached %d after the restart, %d shared", b.cached,
                  shared);
    cr_assert_eq(b.cached, shared);
}

Test(prefix_restart, a_branch_of_a_saved_conversation_after_a_restart_forks_it)
{
    kvpd_proc d;
    start(&d, NULL);
    const char *t1[] = {OPENING " Tell me a story about the dog."};
    usage a = chat(&d, NULL, t1, 1, 12);
    char reply1[2048];
    snprintf(reply1, sizeof reply1, "%s", a.reply);
    const char *t2[] = {t1[0], reply1, "What did the dog eat?"};
    usage a2 = chat(&d, NULL, t2, 3, 8);
    cr_assert_geq(a2.cached, a.prompt + a.completion - 1, "turn 2 did not continue turn 1");
    stop(&d);

    start(&d, NULL);
    /* turn 2 asked again differently: its history is turn 1, not the saved conversation's
     * whole transcript, so no exact match; the saved one is read and forked */
    const char *edit[] = {t1[0], reply1, "Where did the dog sleep?"};
    usage b = chat(&d, NULL, edit, 3, 4);
    cr_assert_geq(b.cached, a.prompt + a.completion - 16,
                  "turn 1 was not reused after the restart (cached %d, turn 1 held %d; log %s)",
                  b.cached, a.prompt + a.completion, d.log);
    cr_assert_eq(b.prefilled, b.prompt - b.cached);
    stop(&d);
}

/* The path of the state directory's snapshot whose bytes hold text (the messages are
 * stored as they are), into path. */
static void snapshot_with(const char *text, char *path, size_t n)
{
    DIR *dir = opendir(g_dir);
    cr_assert(dir);
    int found = 0;
    for (struct dirent *e; (e = readdir(dir));) {
        size_t len = strlen(e->d_name);
        if (len <= 5 || strcmp(e->d_name + len - 5, ".snap"))
            continue;
        char p[256];
        snprintf(p, sizeof p, "%s/%s", g_dir, e->d_name);
        static char bytes[1 << 20];
        FILE *f = fopen(p, "rb");
        size_t got = f ? fread(bytes, 1, sizeof bytes, f) : 0;
        if (f)
            fclose(f);
        if (memmem(bytes, got, text, strlen(text))) {
            snprintf(path, n, "%s", p);
            found++;
        }
    }
    closedir(dir);
    cr_assert_eq(found, 1, "%d snapshots hold \"%s\"", found, text);
}

#define OPENING2 "The little robot rolled across the kitchen floor every morning, looking " \
                 "for crumbs, lost buttons and the cat's favourite toy mouse, and it " \
                 "sang a short song each time it found one."

Test(prefix_restart, a_source_that_cannot_be_read_costs_only_the_fork)
{
    kvpd_proc d;
    start(&d, NULL);
    first_conversation(&d);
    const char *q2[] = {OPENING2 " What did it find today?"};
    chat(&d, NULL, q2, 1, 8);
    stop(&d);
    char damaged[256], gone[256];
    snapshot_with("storyteller", damaged, sizeof damaged);
    snapshot_with("little robot", gone, sizeof gone);
    start(&d, NULL);
    cr_assert(kvpd_log_has(&d, "2 conversation(s) in the prefix index"), "log %s", d.log);
    /* after the index was read: one snapshot damaged, the other gone */
    FILE *f = fopen(damaged, "r+");
    cr_assert(f);
    fputs("not a snapshot", f);
    fclose(f);
    cr_assert_eq(unlink(gone), 0);
    usage b = chat(&d, NULL, SECOND, 1, 4);
    cr_assert_eq(b.cached, 0);
    cr_assert_eq(b.prefilled, b.prompt);
    const char *other[] = {OPENING2 " Did it sing?"};
    usage c = chat(&d, NULL, other, 1, 4);
    cr_assert_eq(c.cached, 0);
    cr_assert_eq(c.prefilled, c.prompt);
    cr_assert(kvpd_log_has(&d, "read from its snapshot to be forked"), "log %s", d.log);
    stop(&d);
}

/* Appends bytes to the state directory's prefix.index. */
static void append_raw(const char *bytes, size_t n)
{
    char path[256];
    snprintf(path, sizeof path, "%s/prefix.index", g_dir);
    int fd = open(path, O_WRONLY | O_APPEND);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, bytes, n), (ssize_t)n);
    close(fd);
}

Test(prefix_restart, a_damaged_prefix_file_is_skipped_line_by_line)
{
    kvpd_proc d;
    start(&d, NULL);
    usage a = first_conversation(&d);
    stop(&d);
    /* garbage, a line cut short, bytes with a NUL, one line far over the bound, and a
     * torn last line */
    static const char garbage[] = "not a line of ours\n"
                                  "0123456789abcdef0123456789abcdef - 3 0000\n"
                                  "zz\0zz 1 2 3\n";
    append_raw(garbage, sizeof garbage - 1);
    size_t huge = 300 * 1024;
    char *big = malloc(huge + 1);
    cr_assert(big);
    memset(big, 'a', huge);
    big[huge] = '\n';
    append_raw(big, huge + 1);
    free(big);
    append_raw("0123456789abcdef0123456789abcdef - 2 00", 39);

    start(&d, NULL);
    cr_assert(kvpd_log_has(&d, "damaged or oversized line(s) skipped"), "log %s", d.log);
    expect_opening_forked(&d, a.prompt);
    stop(&d);
    /* compacted at start: the file holds valid lines only */
    char path[256];
    snprintf(path, sizeof path, "%s/prefix.index", g_dir);
    struct stat st;
    cr_assert_eq(stat(path, &st), 0);
    cr_assert_lt(st.st_size, 64 * 1024, "not compacted: %lld bytes", (long long)st.st_size);
}

Test(prefix_restart, a_parked_conversation_is_a_fork_source)
{
    kvpd_proc d;
    start(&d, "--max-sessions 2");
    usage a = first_conversation(&d);
    /* two unrelated conversations take the two resident slots: the first is parked */
    const char *x[] = {"A frog sat on a log."};
    const char *y[] = {"The sun was hot."};
    chat(&d, NULL, x, 1, 4);
    chat(&d, NULL, y, 1, 4);
    cr_assert_geq(metric(&d, "kvpd_sessions_parked"), 1);
    expect_opening_forked(&d, a.prompt);
    cr_assert(kvpd_log_has(&d, "read from its snapshot to be forked"), "log %s", d.log);
    stop(&d);
}

Test(prefix_restart, another_tenant_never_reads_or_forks_a_saved_conversation)
{
    const char *A = "Authorization: Bearer key-a-1234\r\n", *B = "Authorization: Bearer key-b-1234\r\n";
    kvpd_proc d;
    start(&d, "--api-key key-a-1234,key-b-1234");
    const char *q[] = {OPENING " Tell me a story about the dog."};
    usage a = chat_as(&d, A, NULL, q, 1, 8);
    stop(&d);
    start(&d, "--api-key key-a-1234,key-b-1234");
    const char *other[] = {OPENING " Once upon a time, Lily saw a cat."};
    usage b = chat_as(&d, B, NULL, other, 1, 4);
    cr_assert_eq(b.cached, 0, "another tenant's opening was reused");
    cr_assert_eq(b.prefilled, b.prompt);
    cr_assert(!kvpd_log_has(&d, "read from its snapshot to be forked"),
              "another tenant's conversation was read (log %s)", d.log);
    /* its own tenant's request still finds it */
    usage c = chat_as(&d, A, NULL, other, 1, 4);
    cr_assert_geq(c.cached, a.prompt - 32, "cached %d (log %s)", c.cached, d.log);
    stop(&d);
}

/* SET key to val[0..len) in Redis (RESP, binary-safe), waiting for the answer. */
static void redis_set(int port, const char *key, const char *val, size_t len)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0);
    char head[128];
    int n = snprintf(head, sizeof head, "*3\r\n$3\r\nSET\r\n$%zu\r\n%s\r\n$%zu\r\n",
                     strlen(key), key, len);
    cr_assert_eq(write(fd, head, (size_t)n), n);
    for (size_t at = 0; at < len;) {
        ssize_t w = write(fd, val + at, len - at);
        cr_assert_gt(w, 0);
        at += (size_t)w;
    }
    cr_assert_eq(write(fd, "\r\n", 2), 2);
    char ok[8] = "";
    cr_assert_gt(read(fd, ok, sizeof ok - 1), 0);
    cr_assert(!strncmp(ok, "+OK", 3), "redis answered %s", ok);
    close(fd);
}

/* With Redis instead of a state directory: the lines are kept beside the snapshots
 * (hint:<id>), and a restarted node rebuilds its index from them. */
Test(prefix_restart, with_redis_a_restarted_node_forks_the_stored_opening)
{
    if (!h_have("redis-server"))
        cr_skip_test("redis-server is not installed (scripts/setup.sh installs it)");
    h_proc r;
    cr_assert_eq(h_redis_start(&r, g_dir, 0, 0), 0, "redis-server did not start (log %s)", r.log);
    char args[256];
    snprintf(args, sizeof args, "--state-url redis://127.0.0.1:%d/0", r.port);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "kvpd did not start (log %s)", d.log);
    usage a = first_conversation(&d);
    stop(&d);
    /* hostile hints beside it: garbage with a NUL, and one far over the line bound */
    redis_set(r.port, "hint:garbage", "zz 1 2\0 3\n", 10);
    size_t huge = 200 * 1024;
    char *big = malloc(huge);
    cr_assert(big);
    memset(big, '7', huge);
    redis_set(r.port, "hint:huge", big, huge);
    free(big);
    cr_assert_eq(kvpd_start(&d, args), 0, "kvpd did not start (log %s)", d.log);
    cr_assert(kvpd_log_has(&d, "1 conversation(s) in the prefix index"), "log %s", d.log);
    cr_assert(kvpd_log_has(&d, "2 damaged or oversized hint(s) skipped"), "log %s", d.log);
    expect_opening_forked(&d, a.prompt);
    stop(&d);
    h_proc_stop(&r, 5000);
}
