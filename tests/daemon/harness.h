/* Integration-test harness: starts kvpd (build/daemon/kvpd, or $KVP_KVPD) on an
 * ephemeral loopback port with stories260K, talks to it with wsclient, stops it with
 * SIGTERM. */
#ifndef KVP_HARNESS_H
#define KVP_HARNESS_H

#include <jansson.h>
#include <stddef.h>
#include <sys/types.h>

#include "tools/wsclient.h"

typedef struct kvpd_proc {
    pid_t pid;
    int port;
    char log[64];       /* the daemon's stderr */
    char admin_file[80];   /* --admin-token-file: the token kvpd generates at start */
    int health_503;     /* /healthz answers 503 seen while kvpd_start waited */
} kvpd_proc;

/* Starts kvpd with the test defaults (2 workers, budget 64, chunk 16, greedy, no state
 * directory: --state-dir "") and
 * `extra` (space-separated flags, later ones win); waits for /healthz. 0 or -1. */
int kvpd_start(kvpd_proc *p, const char *extra);
/* As kvpd_start, but returns as soon as the port is bound (the model may be loading). */
int kvpd_spawn(kvpd_proc *p, const char *extra);
/* SIGTERM, then waits up to timeout_ms; returns the exit status, or -1 (killed). This,
 * kvpd_wait and kvpd_kill fail the test when the daemon's log has a ThreadSanitizer
 * report (scripts/test.sh --tsan). */
int kvpd_stop(kvpd_proc *p, int timeout_ms);
/* Waits up to timeout_ms for it to exit (a signal was sent); as kvpd_stop. */
int kvpd_wait(kvpd_proc *p, int timeout_ms);
/* SIGKILL, and reaps it (a crash at an arbitrary moment). */
void kvpd_kill(kvpd_proc *p);
/* 1 when the daemon's log so far has the text. */
int kvpd_log_has(const kvpd_proc *p, const char *text);
/* A fresh directory under /tmp (static buffer per call site is the caller's). */
int h_mkdtemp(char *out, size_t len);
/* Removes a directory, the files in it and its subdirectories'. */
void h_rmdir(const char *dir);
/* The admin token kvpd generated into p->admin_file ("" when none was written). */
const char *h_admin_token(const kvpd_proc *p);
/* GET /admin/stats (with the generated admin token) as JSON (NULL on failure). */
json_t *h_stats(const kvpd_proc *p);
/* "$KVP_BUILD/<rel>", "$KVP_SHARED/<rel>" */
const char *h_build(const char *rel);
const char *h_shared(const char *rel);
/* How many times slower than the plain build kvpd runs ($KVP_TEST_SLOW, 1 to 20; 1 when
 * unset): kvpd_spawn, kvpd_start, kvpd_stop and kvpd_wait wait that many times longer,
 * and the Criterion time limits of a test linked with the harness grow as much. */
int h_slow(void);
/* The kvpd the tests start: $KVP_KVPD when set (scripts/test.sh --tsan: the
 * ThreadSanitizer build's), else "$KVP_BUILD/daemon/kvpd". */
const char *h_kvpd(void);
/* Descriptors process pid has open (its /proc/PID/fd), -1 if it cannot be read. */
int h_open_fds(pid_t pid);

/* Connects to /chat on the daemon. */
int h_connect(const kvpd_proc *p, ws_client *c);
/* Reads one text frame as JSON (NULL on timeout, close or bad JSON). */
json_t *h_read_json(ws_client *c, int timeout_ms);
/* Reads frames until one of the given type (others are returned in skipped count). */
json_t *h_expect(ws_client *c, const char *type, int timeout_ms);
/* Sends a message and reads token frames until done (or error). Returns the final
 * frame; *tokens (malloc'd, may be NULL) is the concatenated token text. max_tokens 0:
 * the message has no max_tokens field. */
json_t *h_turn(ws_client *c, const char *text, int max_tokens, char **tokens);
/* h_turn that must end in done (the error's code and message otherwise). */
void h_turn_ok(ws_client *c, const char *text, int max_tokens);
/* GET with an optional bearer token; returns the status, body malloc'd. */
int h_get(const kvpd_proc *p, const char *path, const char *token, char **body);
/* POST /v1/chat/completions with body, asserting 200: the answer's JSON (the caller frees
 * it) and the raw answer, headers included, in *raw (malloc'd). */
json_t *h_complete(const kvpd_proc *p, const char *body, char **raw);
/* A chat completion's first choice's message content (borrowed from j), or NULL. */
const char *h_reply_of(const json_t *j);
/* A conversation's second turn as a chat completion body (compact JSON, malloc'd): the
 * user's first message, the assistant's reply, the user's next message, max_tokens, and
 * the session id when id is not NULL. */
char *h_second_turn(const char *first, const char *reply, const char *next, int max_tokens,
                    const char *id);
/* The files in dir whose names end in ext (0 when dir cannot be read). */
int h_count_files(const char *dir, const char *ext);
/* Reads from fd until the peer closes or timeout_ms pass with nothing; the bytes,
 * NUL-terminated (malloc'd), their count in *len (may be NULL). */
char *h_read_all(int fd, int timeout_ms, size_t *len);
/* One HTTP request with a body (Connection: close) to 127.0.0.1:port; extra_headers
 * are whole "Name: value\r\n" lines or NULL. Returns the status; *raw (malloc'd) is the
 * whole answer, *body points into it. */
int h_request(int port, const char *method, const char *path, const char *extra_headers,
              const char *body, char **raw, const char **resp_body);
/* The value of the response header `name` (lowercase, with the colon) in raw, or "". */
const char *h_header(const char *raw, const char *name);
/* The value of an unlabelled sample in Prometheus text, or -1. */
double h_metric(const char *text, const char *name);

/* A helper server a test starts (redis-server, haproxy): dies with the test. */
typedef struct h_proc {
    pid_t pid;
    int port;
    char log[64];       /* its stdout and stderr */
} h_proc;

/* 1 when the program is found in PATH. */
int h_have(const char *prog);
/* A free loopback TCP port (bound, then released). */
int h_free_port(void);
/* A loopback port bound to *held but never listened on, so a connection to it is
 * refused for as long as *held stays open and no other process can take it. */
int h_closed_port(int *held);
/* Runs argv (argv[0] looked up in PATH); with port > 0, waits up to timeout_ms until it
 * accepts connections there. 0 or -1 (then its log says why). */
int h_proc_start(h_proc *p, char *const argv[], int port, int timeout_ms);
/* SIGTERM and wait up to timeout_ms (then SIGKILL); SIGKILL at once. */
int h_proc_stop(h_proc *p, int timeout_ms);
void h_proc_kill(h_proc *p);
/* redis-server on `port` (0: a free one) with its files in dir. flags: H_REDIS_AOF,
 * appendonly with appendfsync always (every write on disk before the reply);
 * H_REDIS_DEBUG, the DEBUG command allowed from loopback (DEBUG SLEEP stalls it). */
#define H_REDIS_AOF 1
#define H_REDIS_DEBUG 2
int h_redis_start(h_proc *r, const char *dir, int port, int flags);
/* A test's redis-server (flags as above, a free port) with its files in a new temporary
 * directory, written to dir (dir_len bytes); skips the test when redis-server is not
 * installed. h_redis_down kills it and removes the directory (dir "": none was made). */
void h_redis_up(h_proc *r, char *dir, size_t dir_len, int flags);
void h_redis_down(h_proc *r, const char *dir);

/* A daemon test suite with a state directory per test: declares `static char g_dir[128]`,
 * made by h_mkdtemp before each test and removed by h_rmdir after it, and the Criterion
 * suite `name` doing both, with the suite's other options after the name
 * (H_STATE_DIR_SUITE(persist, .timeout = 90)). */
#define H_STATE_DIR_SUITE(name, ...)                                                       \
    static char g_dir[128];                                                                \
    static void name##_setup(void)                                                         \
    {                                                                                      \
        cr_assert_eq(h_mkdtemp(g_dir, sizeof g_dir), 0);                                   \
    }                                                                                      \
    static void name##_teardown(void)                                                      \
    {                                                                                      \
        h_rmdir(g_dir);                                                                    \
    }                                                                                      \
    TestSuite(name, .init = name##_setup, .fini = name##_teardown, __VA_ARGS__)

/* h_redis_up, then a connection to its database `db` (SELECT db) in *rc. h_redis_db_down
 * closes the connection (when there is one, *rc then NULL) and does h_redis_down. */
struct redisContext;
void h_redis_db_up(h_proc *r, char *dir, size_t dir_len, int flags, int db,
                   struct redisContext **rc);
void h_redis_db_down(h_proc *r, const char *dir, struct redisContext **rc);

/* A test file's redis-server fixture on database `db`: declares g_redis, g_rdir (its
 * files' directory) and g_rc (the connection), and redis_up / redis_down for a suite's or
 * a test's .init and .fini (h_redis_db_up and h_redis_db_down, flags 0). */
#define H_REDIS_DB_FIXTURE(db)                                                             \
    static h_proc g_redis;                                                                 \
    static char g_rdir[64];                                                                \
    static struct redisContext *g_rc;                                                      \
    static void redis_up(void)                                                             \
    {                                                                                      \
        h_redis_db_up(&g_redis, g_rdir, sizeof g_rdir, 0, (db), &g_rc);                    \
    }                                                                                      \
    static void redis_down(void)                                                           \
    {                                                                                      \
        h_redis_db_down(&g_redis, g_rdir, &g_rc);                                          \
    }

#endif
