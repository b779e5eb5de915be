/* Integration-test harness (see harness.h). */
#include "tests/daemon/harness.h"

#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <criterion/hooks.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <hiredis/hiredis.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static const char *env_path(const char *var, const char *fallback, const char *rel)
{
    static char bufs[4][1024];
    static int next;
    char *b = bufs[next++ & 3];
    const char *root = getenv(var);
    snprintf(b, sizeof bufs[0], "%s/%s", root ? root : fallback, rel);
    return b;
}

const char *h_build(const char *rel) { return env_path("KVP_BUILD", "build", rel); }
const char *h_shared(const char *rel) { return env_path("KVP_SHARED", "../shared", rel); }

int h_slow(void)
{
    const char *v = getenv("KVP_TEST_SLOW");
    int n = v ? atoi(v) : 1;
    return n < 1 ? 1 : n > 20 ? 20 : n;
}

/* Criterion's own time limits (a suite's or a test's .timeout) grow with h_slow() too: in
 * the runner, before it starts the first test. */
ReportHook(PRE_ALL)(struct criterion_test_set *set)
{
    int k = h_slow();
    if (k == 1)
        return;
    FOREACH_SET(struct criterion_suite_set *ss, set->suites) {
        if (ss->suite.data && ss->suite.data->timeout > 0)
            ss->suite.data->timeout *= k;
        FOREACH_SET(struct criterion_test *t, ss->tests)
            if (t->data && t->data->timeout > 0)
                t->data->timeout *= k;
    }
}

const char *h_kvpd(void)
{
    const char *bin = getenv("KVP_KVPD");
    return bin && bin[0] ? bin : h_build("daemon/kvpd");
}

int h_open_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    if (!d)
        return -1;
    int n = 0;
    while (readdir(d))
        n++;
    closedir(d);
    return n - 2;   /* . and .. */
}

static void sleep_ms(int ms)
{
    nanosleep(&(struct timespec){ms / 1000, (long)(ms % 1000) * 1000000L}, NULL);
}

/* A ThreadSanitizer kvpd (scripts/test.sh --tsan) writes its reports to stderr, the
 * daemon's log. Prints the report to the test's stderr; 1 when there was one. */
static int print_race(const char *log)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return 0;
    char line[2048];
    int lines = 0;
    while (fgets(line, sizeof line, f) && lines < 80)
        if (lines || strstr(line, "ThreadSanitizer")) {
            if (!lines++)
                fprintf(stderr, "kvpd reported a ThreadSanitizer error; its log: %s\n", log);
            fputs(line, stderr);
        }
    fclose(f);
    return lines > 0;
}

/* The logs of the daemons started and not reaped yet: a failed assertion ends the test
 * before its kvpd_stop, and the report that made it fail is printed at exit. */
#define H_MAX_LIVE 32
static char g_live[H_MAX_LIVE][64];

static void print_live_races(void)
{
    for (int i = 0; i < H_MAX_LIVE; i++)
        if (g_live[i][0])
            print_race(g_live[i]);
}

static void live_add(const char *log)
{
    static int registered;
    if (!registered)
        registered = atexit(print_live_races) == 0;
    for (int i = 0; i < H_MAX_LIVE; i++)
        if (!g_live[i][0]) {
            snprintf(g_live[i], sizeof g_live[i], "%s", log);
            return;
        }
}

static void live_del(const char *log)
{
    for (int i = 0; i < H_MAX_LIVE; i++)
        if (!strcmp(g_live[i], log))
            g_live[i][0] = '\0';
}

/* Once the daemon is reaped: a report in its log fails the test whatever its exit
 * status (a test may not look at it, or may have killed the daemon). */
static int check_races(const kvpd_proc *p)
{
    live_del(p->log);
    if (!print_race(p->log))
        return 0;
    cr_expect(0, "kvpd reported a ThreadSanitizer error; its log: %s", p->log);
    return 1;
}

/* The port from the "listening on 127.0.0.1:PORT" line, 0 while not there yet. */
static int read_port(const char *log)
{
    FILE *f = fopen(log, "r");
    if (!f)
        return 0;
    char line[512];
    int port = 0;
    while (!port && fgets(line, sizeof line, f)) {
        const char *p = strstr(line, "listening on ");
        const char *colon = p ? strrchr(p, ':') : NULL;
        if (colon)
            port = atoi(colon + 1);
    }
    fclose(f);
    return port;
}

int kvpd_spawn(kvpd_proc *p, const char *extra)
{
    memset(p, 0, sizeof *p);
    snprintf(p->log, sizeof p->log, "/tmp/kvpd-test-XXXXXX");
    int fd = mkstemp(p->log);
    if (fd < 0)
        return -1;
    char *argv[64];
    int argc = 0;
    snprintf(p->admin_file, sizeof p->admin_file, "%s.admin", p->log);
    char model[1024], tok[1024];
    snprintf(model, sizeof model, "%s", h_shared("models/stories260K.bin"));
    snprintf(tok, sizeof tok, "%s", h_shared("models/tok512.bin"));
    char *defaults[] = {"--listen", "127.0.0.1:0", "--model", model, "--tokenizer", tok,
                        "--workers", "2", "--budget", "64", "--chunk", "16",
                        "--temperature", "0", "--max-tokens", "64",
                        "--shutdown-timeout-ms", "3000", "--admin-token-file", p->admin_file,
                        "--state-dir", ""};
    argv[argc++] = (char *)h_kvpd();
    for (size_t i = 0; i < sizeof defaults / sizeof defaults[0]; i++)
        argv[argc++] = defaults[i];
    char *copy = strdup(extra ? extra : "");
    for (char *save, *t = strtok_r(copy, " ", &save); t && argc < 62; t = strtok_r(NULL, " ", &save))
        argv[argc++] = t;
    argv[argc] = NULL;
    pid_t parent = getpid();
    p->pid = fork();
    if (p->pid == 0) {
        /* A test that fails ends its process without kvpd_stop: the daemon goes with it
         * (the check covers a parent that was gone before the prctl). */
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
            _exit(127);
        dup2(fd, 2);
        int null = open("/dev/null", O_RDWR);
        dup2(null, 0);
        dup2(null, 1);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd);
    free(copy);
    if (p->pid < 0)
        return -1;
    live_add(p->log);
    for (int i = 0; i < 400 * h_slow() && !p->port; i++) {
        p->port = read_port(p->log);
        if (!p->port)
            sleep_ms(25);
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
            p->pid = 0;
            return -1;
        }
    }
    return p->port ? 0 : -1;
}

int kvpd_start(kvpd_proc *p, const char *extra)
{
    if (kvpd_spawn(p, extra) < 0)
        return -1;
    for (int i = 0; i < 400 * h_slow() && p->port; i++) {
        char *body = NULL;
        int st = http_get("127.0.0.1", p->port, "/healthz", NULL, &body, 2000);
        free(body);
        if (st == 200)
            return 0;
        p->health_503 += st == 503;
        sleep_ms(25);
    }
    return -1;
}

int kvpd_stop(kvpd_proc *p, int timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    kill(p->pid, SIGTERM);
    return kvpd_wait(p, timeout_ms);
}

int kvpd_wait(kvpd_proc *p, int timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    timeout_ms *= h_slow();
    int status = 0;
    for (int waited = 0; waited < timeout_ms; waited += 10) {
        pid_t r = waitpid(p->pid, &status, WNOHANG);
        if (r == p->pid) {
            p->pid = 0;
            unlink(p->admin_file);
            if (!check_races(p) && WIFEXITED(status) && WEXITSTATUS(status) == 0)
                unlink(p->log);   /* kept on failure for the record */
            else
                fprintf(stderr, "kvpd exited abnormally; its log: %s\n", p->log);
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        sleep_ms(10);
    }
    kill(p->pid, SIGKILL);
    waitpid(p->pid, &status, 0);
    p->pid = 0;
    check_races(p);
    fprintf(stderr, "kvpd did not stop in %d ms; its log: %s\n", timeout_ms, p->log);
    return -1;
}

void kvpd_kill(kvpd_proc *p)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
    check_races(p);
}

int kvpd_log_has(const kvpd_proc *p, const char *text)
{
    FILE *f = fopen(p->log, "r");
    if (!f)
        return 0;
    char line[2048];
    int found = 0;
    while (!found && fgets(line, sizeof line, f))
        found = strstr(line, text) != NULL;
    fclose(f);
    return found;
}

int h_mkdtemp(char *out, size_t len)
{
    snprintf(out, len, "/tmp/kvpd-state-XXXXXX");
    return mkdtemp(out) ? 0 : -1;
}

void h_rmdir(const char *dir)
{
    DIR *d = opendir(dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d)))
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..") &&
            unlinkat(dirfd(d), e->d_name, 0) < 0 && errno == EISDIR) {
            char sub[PATH_MAX];   /* one level down: the state directory's responses/ */
            if (snprintf(sub, sizeof sub, "%s/%s", dir, e->d_name) < (int)sizeof sub)
                h_rmdir(sub);
        }
    closedir(d);
    rmdir(dir);
}

const char *h_admin_token(const kvpd_proc *p)
{
    static char tok[128];
    tok[0] = '\0';
    FILE *f = fopen(p->admin_file, "r");
    if (f) {
        if (!fgets(tok, sizeof tok, f))
            tok[0] = '\0';
        fclose(f);
    }
    tok[strcspn(tok, "\n")] = '\0';
    return tok;
}

json_t *h_stats(const kvpd_proc *p)
{
    char *body = NULL;
    int st = h_get(p, "/admin/stats", h_admin_token(p), &body);
    json_t *j = st == 200 && body ? json_loads(body, 0, NULL) : NULL;
    free(body);
    return j;
}

int h_connect(const kvpd_proc *p, ws_client *c)
{
    return ws_connect(c, "127.0.0.1", p->port, "/chat", 5000);
}

json_t *h_read_json(ws_client *c, int timeout_ms)
{
    char *msg = NULL;
    size_t len = 0;
    int op = ws_read(c, timeout_ms, &msg, &len);
    json_t *j = op == WS_TEXT ? json_loadb(msg, len, 0, NULL) : NULL;
    free(msg);
    return j;
}

json_t *h_expect(ws_client *c, const char *type, int timeout_ms)
{
    double deadline = ws_now_ms() + timeout_ms;
    for (;;) {
        int left = (int)(deadline - ws_now_ms());
        if (left <= 0)
            return NULL;
        json_t *j = h_read_json(c, left);
        if (!j)
            return NULL;
        const char *t = json_string_value(json_object_get(j, "type"));
        if (t && !strcmp(t, type))
            return j;
        json_decref(j);
    }
}

json_t *h_turn(ws_client *c, const char *text, int max_tokens, char **tokens)
{
    json_t *m = json_pack("{s:s, s:s}", "type", "message", "text", text);
    if (max_tokens > 0)   /* 0: none, the daemon's own limit */
        json_object_set_new(m, "max_tokens", json_integer(max_tokens));
    char *s = json_dumps(m, JSON_COMPACT);
    json_decref(m);
    int rc = ws_send_text(c, s);
    free(s);
    if (tokens)
        *tokens = NULL;
    if (rc < 0)
        return NULL;
    size_t tl = 0;
    for (;;) {
        json_t *j = h_read_json(c, 30000);
        if (!j)
            return NULL;
        const char *t = json_string_value(json_object_get(j, "type"));
        if (t && !strcmp(t, "token")) {
            const char *piece = json_string_value(json_object_get(j, "text"));
            size_t pl = piece ? strlen(piece) : 0;
            if (tokens) {
                char *n = realloc(*tokens, tl + pl + 1);
                if (n) {
                    memcpy(n + tl, piece, pl);
                    tl += pl;
                    n[tl] = '\0';
                    *tokens = n;
                }
            }
            json_decref(j);
            continue;
        }
        if (t && (!strcmp(t, "done") || !strcmp(t, "error")))
            return j;
        json_decref(j);   /* e.g. the session frame of a first message */
    }
}

int h_get(const kvpd_proc *p, const char *path, const char *token, char **body)
{
    char auth[256];
    if (token)
        snprintf(auth, sizeof auth, "Bearer %s", token);
    return http_get("127.0.0.1", p->port, path, token ? auth : NULL, body, 5000);
}

double h_metric(const char *text, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = text; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL)
        if (!strncmp(p, name, n) && p[n] == ' ')
            return atof(p + n + 1);
    return -1;
}

int h_have(const char *prog)
{
    const char *path = getenv("PATH");
    char buf[1024];
    for (const char *p = path ? path : "/usr/bin:/bin"; *p;) {
        size_t n = strcspn(p, ":");
        snprintf(buf, sizeof buf, "%.*s/%s", (int)n, p, prog);
        if (access(buf, X_OK) == 0)
            return 1;
        p += n + (p[n] == ':');
    }
    return 0;
}

int h_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    int port = -1;
    if (fd >= 0 && bind(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
        getsockname(fd, (struct sockaddr *)&a, &len) == 0)
        port = ntohs(a.sin_port);
    if (fd >= 0)
        close(fd);
    return port;
}

int h_closed_port(int *held)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof a;
    if (fd < 0 || bind(fd, (struct sockaddr *)&a, sizeof a) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    *held = fd;
    return ntohs(a.sin_port);
}

static int port_open(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0;
    if (fd >= 0)
        close(fd);
    return ok;
}

int h_proc_start(h_proc *p, char *const argv[], int port, int timeout_ms)
{
    memset(p, 0, sizeof *p);
    p->port = port;
    snprintf(p->log, sizeof p->log, "/tmp/kvpd-helper-XXXXXX");
    int fd = mkstemp(p->log);
    if (fd < 0)
        return -1;
    pid_t parent = getpid();
    p->pid = fork();
    if (p->pid == 0) {
        if (prctl(PR_SET_PDEATHSIG, SIGKILL) < 0 || getppid() != parent)
            _exit(127);
        dup2(fd, 1);
        dup2(fd, 2);
        int null = open("/dev/null", O_RDONLY);
        dup2(null, 0);
        execvp(argv[0], argv);
        _exit(127);
    }
    close(fd);
    if (p->pid < 0)
        return -1;
    for (int waited = 0; port > 0 && waited < timeout_ms; waited += 20) {
        if (port_open(port))
            return 0;
        if (waitpid(p->pid, NULL, WNOHANG) == p->pid) {
            p->pid = 0;
            fprintf(stderr, "%s exited at start; its log: %s\n", argv[0], p->log);
            return -1;
        }
        sleep_ms(20);
    }
    if (port > 0) {
        fprintf(stderr, "%s did not listen on %d; its log: %s\n", argv[0], port, p->log);
        return -1;
    }
    return 0;
}

int h_proc_stop(h_proc *p, int timeout_ms)
{
    if (p->pid <= 0)
        return -1;
    kill(p->pid, SIGTERM);
    int status = 0;
    for (int waited = 0; waited < timeout_ms; waited += 10) {
        if (waitpid(p->pid, &status, WNOHANG) == p->pid) {
            p->pid = 0;
            return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
        }
        sleep_ms(10);
    }
    h_proc_kill(p);
    return -1;
}

void h_proc_kill(h_proc *p)
{
    if (p->pid <= 0)
        return;
    kill(p->pid, SIGKILL);
    waitpid(p->pid, NULL, 0);
    p->pid = 0;
}

/* Whether the server on port answers PING as Redis does, or says it is loading its data
 * (not some other process that took the port between h_free_port and redis-server's
 * bind). */
static int redis_pongs(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    char buf[16] = "";
    int ok = fd >= 0 && connect(fd, (struct sockaddr *)&a, sizeof a) == 0 &&
             send(fd, "PING\r\n", 6, MSG_NOSIGNAL) == 6;
    if (ok) {
        struct pollfd pf = {fd, POLLIN, 0};
        ok = poll(&pf, 1, 2000) == 1 && recv(fd, buf, sizeof buf - 1, 0) > 0 &&
             (!strncmp(buf, "+PONG", 5) || !strncmp(buf, "-LOADING", 8));
    }
    if (fd >= 0)
        close(fd);
    return ok;
}

int h_redis_start(h_proc *r, const char *dir, int port, int flags)
{
    /* a free port can be taken by another test's server before redis binds it: then
     * this redis-server exits and another port is tried */
    for (int attempt = 0; attempt < (port > 0 ? 1 : 5); attempt++) {
        int p = port > 0 ? port : h_free_port();
        char portbuf[16];
        snprintf(portbuf, sizeof portbuf, "%d", p);
        char *argv[] = {"redis-server", "--port", portbuf, "--bind", "127.0.0.1", "--dir",
                        (char *)dir, "--save", "", "--appendonly",
                        flags & H_REDIS_AOF ? "yes" : "no", "--appendfsync", "always",
                        "--enable-debug-command", flags & H_REDIS_DEBUG ? "local" : "no",
                        "--daemonize", "no", "--logfile", "", NULL};
        if (h_proc_start(r, argv, p, 10000) == 0 && redis_pongs(p) &&
            waitpid(r->pid, NULL, WNOHANG) == 0)
            return 0;
        h_proc_kill(r);
    }
    return -1;
}

void h_redis_up(h_proc *r, char *dir, size_t dir_len, int flags)
{
    if (!h_have("redis-server"))
        cr_skip_test("redis-server is not installed (scripts/setup.sh installs it)");
    cr_assert_eq(h_mkdtemp(dir, dir_len), 0);
    cr_assert_eq(h_redis_start(r, dir, 0, flags), 0, "redis-server did not start");
}

void h_redis_down(h_proc *r, const char *dir)
{
    h_proc_kill(r);
    if (dir[0])
        h_rmdir(dir);
}

char *h_read_all(int fd, int timeout_ms, size_t *len)
{
    size_t cap = 1 << 16, got = 0;
    char *buf = malloc(cap);
    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        if (poll(&pf, 1, timeout_ms) <= 0)
            break;
        if (got + 4096 > cap)
            buf = realloc(buf, cap *= 2);
        ssize_t r = recv(fd, buf + got, cap - got - 1, 0);
        if (r <= 0)
            break;
        got += (size_t)r;
    }
    buf[got] = '\0';
    if (len)
        *len = got;
    return buf;
}

int h_request(int port, const char *method, const char *path, const char *extra_headers,
              const char *body, char **raw, const char **resp_body)
{
    *raw = NULL;
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0) {
        if (fd >= 0)
            close(fd);
        return -1;
    }
    size_t blen = strlen(body);
    char head[1024];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n%s"
                     "Connection: close\r\n\r\n", method, path, blen,
                     extra_headers ? extra_headers : "");
    /* A send cut short is not an error: the server may answer (413) and close before it
     * has read an oversized body, and that answer is still readable. */
    if (send(fd, head, (size_t)n, MSG_NOSIGNAL) == n) {
        for (size_t sent = 0; sent < blen;) {
            ssize_t w = send(fd, body + sent, blen - sent, MSG_NOSIGNAL);
            if (w < 0 && errno == EINTR)
                continue;
            if (w <= 0)
                break;
            sent += (size_t)w;
        }
    }
    size_t got;
    char *buf = h_read_all(fd, 30000, &got);
    close(fd);
    *raw = buf;
    int status = -1;
    sscanf(buf, "HTTP/1.1 %d", &status);
    char *b = strstr(buf, "\r\n\r\n");
    *resp_body = b ? b + 4 : buf + got;
    return status;
}

const char *h_header(const char *raw, const char *name)
{
    static char v[256];
    v[0] = '\0';
    const char *end = strstr(raw, "\r\n\r\n");
    const char *h = strcasestr(raw, name);
    if (h && (!end || h < end))
        sscanf(h + strlen(name), " %255[^\r\n]", v);
    return v;
}

json_t *h_complete(const kvpd_proc *p, const char *body, char **raw)
{
    const char *b;
    int st = h_request(p->port, "POST", "/v1/chat/completions", NULL, body, raw, &b);
    cr_assert_eq(st, 200, "%s", *raw ? *raw : "(no answer)");
    json_t *j = json_loads(b, 0, NULL);
    cr_assert(j, "%s", b);
    return j;
}

const char *h_reply_of(const json_t *j)
{
    return json_string_value(json_object_get(
        json_object_get(json_array_get(json_object_get(j, "choices"), 0), "message"),
        "content"));
}

char *h_second_turn(const char *first, const char *reply, const char *next, int max_tokens,
                    const char *id)
{
    json_t *req = json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}], s:i}", "messages",
                            "role", "user", "content", first, "role", "assistant", "content",
                            reply, "role", "user", "content", next, "max_tokens", max_tokens);
    cr_assert(req, "a message is not UTF-8");
    if (id)
        json_object_set_new(req, "session", json_string(id));
    char *s = json_dumps(req, JSON_COMPACT);
    json_decref(req);
    return s;
}

void h_turn_ok(ws_client *c, const char *text, int max_tokens)
{
    json_t *done = h_turn(c, text, max_tokens, NULL);
    cr_assert(done, "no answer to '%s'", text);
    const char *type = json_string_value(json_object_get(done, "type"));
    cr_assert(type && !strcmp(type, "done"), "'%s': %s %s: %s", text, type ? type : "?",
              json_string_value(json_object_get(done, "code")) ?: "",
              json_string_value(json_object_get(done, "message")) ?: "");
    json_decref(done);
}

void h_redis_db_up(h_proc *r, char *dir, size_t dir_len, int flags, int db,
                   struct redisContext **rc)
{
    h_redis_up(r, dir, dir_len, flags);
    *rc = redisConnect("127.0.0.1", r->port);
    cr_assert(*rc && !(*rc)->err, "no connection to redis-server on port %d", r->port);
    freeReplyObject(redisCommand(*rc, "SELECT %d", db));
}

void h_redis_db_down(h_proc *r, const char *dir, struct redisContext **rc)
{
    if (*rc)
        redisFree(*rc);
    *rc = NULL;
    h_redis_down(r, dir);
}

int h_count_files(const char *dir, const char *ext)
{
    DIR *d = opendir(dir);
    size_t el = strlen(ext);
    int n = 0;
    for (struct dirent *e; d && (e = readdir(d));) {
        size_t l = strlen(e->d_name);
        n += l > el && !strcmp(e->d_name + l - el, ext);
    }
    if (d)
        closedir(d);
    return n;
}
