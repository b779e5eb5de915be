/* loadgen: N concurrent websocket sessions x M turns against kvpd. Reports aggregate
 * tokens/s, p50/p99 time to first token and inter-token latency, kvpd's peak RSS, and
 * the time to first token at turn 10 with KV cache reuse against re-prefilling the
 * whole transcript every turn (two daemons, --no-reuse-cache for the second). TTFT is
 * given over every turn and over the sessions' first messages alone (a burst's new
 * conversations, apart from the returning sessions' later turns).
 *
 *   build/bench/loadgen [--kvpd build/daemon/kvpd] [--model M --tokenizer T]
 *                       [--sessions 16] [--turns 10] [--max-tokens 32] [--workers 0]
 *                       [--budget 256] [--reps 5] [--port P --pid PID]
 *                       [--concurrency 1,4,8,16,32 [--svg PATH] [--label NAME]]
 *                       [--stagger-ms S] [--system-words N] [--temperature T] [--top-p P]
 * --temperature and --top-p are the spawned daemon's sampling defaults (default greedy:
 * temperature 0), which every message of the load uses. With --port it drives a daemon
 * that is already running (RSS needs --pid) and skips
 * the reuse comparison. With --concurrency it sweeps the load instead, on one daemon
 * (the step loop batches the sessions): each level's aggregate tokens/s (reply tokens,
 * and processed: prompt tokens prefilled plus reply tokens) and TTFT p50 / p99 with
 * their ratios to the first level, in a table and (--svg) a plot. By default every
 * session sends its first message at once (a burst: the last first token waits for all
 * the prompts); --stagger-ms S starts session i at i x S ms instead, so messages arrive
 * spread out, as users' do, and each prompt meets the decodes already running.
 * --system-words N starts every session with the same system text of N words (a hello
 * with `system`), as an application's shared system prompt. */
#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "offline/svgplot.h"
#include "tools/wsclient.h"

#define MAX_LEVELS 16

typedef struct opts {
    const char *kvpd, *model, *tokenizer, *svg, *label;
    const char *temperature, *top_p;    /* the daemon's sampling defaults (NULL top_p: its own) */
    int sessions, turns, max_tokens, workers, budget, reps, port, pid;
    int stagger_ms;                     /* session i starts at i x stagger_ms */
    int system_words;                   /* every session's system text: this many words */
    int levels[MAX_LEVELS], n_levels;   /* --concurrency */
} opts;

/* What one load run measured. */
typedef struct load_result {
    double tok_s, ttft_p50, ttft_p99;
    double first_p50, first_p99;         /* TTFT of the sessions' first messages only */
    double processed_s;                  /* prompt tokens prefilled + reply tokens, per s */
    double prompt_first, prompt_later;   /* mean prompt tokens prefilled: first turns, later */
} load_result;

typedef struct samples {
    double *v;
    size_t n, cap;
} samples;

static int add(samples *s, double x)
{
    if (s->n == s->cap) {
        size_t cap = s->cap ? s->cap * 2 : 1024;
        double *v = realloc(s->v, cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        s->v = v;
        s->cap = cap;
    }
    s->v[s->n++] = x;
    return 0;
}

static int cmp_double(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(samples *s, double p)
{
    if (!s->n)
        return 0;
    qsort(s->v, s->n, sizeof *s->v, cmp_double);
    size_t i = (size_t)(p / 100.0 * (double)(s->n - 1) + 0.5);
    return s->v[i];
}

static const char *lines[] = {
    "Once upon a time, there was a little girl named Lily.",
    "She liked to play with her red ball in the garden.",
    "One day, a big dog came to the garden.",
    "The dog wanted to play too, so Lily threw the ball.",
    "They ran and laughed until the sun went down.",
};

typedef struct session_run {
    const opts *o;
    int port, index;
    samples ttft, itl;       /* ms, client side */
    double ttft_first;       /* ms, client side: of the session's first message */
    long tokens;
    long prefilled[2];       /* prompt tokens prefilled: first turn, later turns */
    double ttft_turn10;      /* server-side ttft_ms of turn 10 */
    int failed;
} session_run;

static double now_ms(void) { return ws_now_ms(); }

/* Starts the session with a system text of `words` words (the story lines in turn, the
 * same for every session: a shared system prompt) and waits for its session frame.
 * 0, or -1 when the daemon refused it. */
static int hello_system(ws_client *c, int words)
{
    size_t cap = (size_t)words * 16 + 64, n = 0;
    char *text = malloc(cap);
    if (!text)
        return -1;
    for (int w = 0, l = 0; w < words; l = (l + 1) % 5) {
        const char *p = lines[l];
        while (*p && w < words) {
            const char *e = strchr(p, ' ');
            size_t len = e ? (size_t)(e - p) : strlen(p);
            if (n + len + 2 >= cap)
                break;
            n += (size_t)snprintf(text + n, cap - n, "%s%.*s", n ? " " : "", (int)len, p);
            w++;
            p += len + (e != NULL);
        }
        if (n + 32 >= cap)
            break;
    }
    json_t *hello = json_pack("{s:s, s:s}", "type", "hello", "system", text);
    free(text);
    char *msg = hello ? json_dumps(hello, JSON_COMPACT) : NULL;
    json_decref(hello);
    int rc = msg && ws_send_text(c, msg) == 0 ? 0 : -1;
    free(msg);
    while (rc == 0) {
        char *payload = NULL;
        size_t len = 0;
        int op = ws_read(c, 60000, &payload, &len);
        json_t *j = op == WS_TEXT ? json_loadb(payload, len, 0, NULL) : NULL;
        free(payload);
        const char *type = j ? json_string_value(json_object_get(j, "type")) : NULL;
        if (!type || !strcmp(type, "error"))
            rc = -1;
        int done = type && !strcmp(type, "session");
        json_decref(j);
        if (done)
            break;
    }
    return rc;
}

/* One conversation of o->turns turns; collects latencies. */
static void *run_session(void *arg)
{
    session_run *r = arg;
    ws_client c;
    if (r->o->stagger_ms > 0) {
        long ms = (long)r->index * r->o->stagger_ms;
        nanosleep(&(struct timespec){ms / 1000, ms % 1000 * 1000000L}, NULL);
    }
    if (ws_connect(&c, "127.0.0.1", r->port, "/chat", 10000) < 0) {
        r->failed = 1;
        return NULL;
    }
    if (r->o->system_words > 0 && hello_system(&c, r->o->system_words) < 0)
        r->failed = 1;
    for (int t = 0; t < r->o->turns && !r->failed; t++) {
        char msg[512];
        snprintf(msg, sizeof msg, "{\"type\":\"message\",\"text\":\"%s\",\"max_tokens\":%d}",
                 lines[(t + r->index) % 5], r->o->max_tokens);
        double sent = now_ms(), last = 0;
        if (ws_send_text(&c, msg) < 0) {
            r->failed = 1;
            break;
        }
        for (;;) {
            char *payload = NULL;
            size_t len = 0;
            int op = ws_read(&c, 60000, &payload, &len);
            json_t *j = op == WS_TEXT ? json_loadb(payload, len, 0, NULL) : NULL;
            free(payload);
            const char *type = j ? json_string_value(json_object_get(j, "type")) : NULL;
            double at = now_ms();
            if (!type) {
                r->failed = 1;
            } else if (!strcmp(type, "token")) {
                if (last == 0) {
                    add(&r->ttft, at - sent);
                    if (t == 0)
                        r->ttft_first = at - sent;
                }
                else
                    add(&r->itl, at - last);
                last = at;
                r->tokens++;
            } else if (!strcmp(type, "done")) {
                r->prefilled[t > 0] += (long)json_integer_value(
                    json_object_get(json_object_get(j, "stats"), "prefilled_tokens"));
                if (t == 9)
                    r->ttft_turn10 = json_number_value(
                        json_object_get(json_object_get(j, "stats"), "ttft_ms"));
                json_decref(j);
                break;
            } else if (!strcmp(type, "error")) {
                fprintf(stderr, "loadgen: error frame: %s\n",
                        json_string_value(json_object_get(j, "message")));
                r->failed = 1;
            }
            json_decref(j);
            if (r->failed)
                break;
        }
    }
    ws_close(&c);
    return NULL;
}

typedef struct daemon_proc {
    pid_t pid;
    int port;
    char log[64];
} daemon_proc;

static int spawn(const opts *o, int reuse, daemon_proc *d)
{
    char workers[16], budget[16], max_tokens[16];
    snprintf(workers, sizeof workers, "%d", o->workers);
    snprintf(budget, sizeof budget, "%d", o->budget);
    snprintf(max_tokens, sizeof max_tokens, "%d", o->max_tokens > 256 ? o->max_tokens : 256);
    snprintf(d->log, sizeof d->log, "/tmp/kvpd-loadgen-XXXXXX");
    int fd = mkstemp(d->log);
    if (fd < 0)
        return -errno;
    char *argv[32];
    int n = 0;
    argv[n++] = (char *)o->kvpd;
    argv[n++] = "--listen";
    argv[n++] = "127.0.0.1:0";
    argv[n++] = "--workers";
    argv[n++] = workers;
    argv[n++] = "--budget";
    argv[n++] = budget;
    argv[n++] = "--max-tokens";
    argv[n++] = max_tokens;
    argv[n++] = "--temperature";
    argv[n++] = (char *)o->temperature;
    if (o->top_p) {
        argv[n++] = "--top-p";
        argv[n++] = (char *)o->top_p;
    }
    argv[n++] = "--max-sessions";
    argv[n++] = "1024";
    if (o->model) {
        argv[n++] = "--model";
        argv[n++] = (char *)o->model;
    }
    if (o->tokenizer) {
        argv[n++] = "--tokenizer";
        argv[n++] = (char *)o->tokenizer;
    }
    if (!reuse)
        argv[n++] = "--no-reuse-cache";
    argv[n] = NULL;
    d->pid = fork();
    if (d->pid == 0) {
        dup2(fd, 2);
        execv(argv[0], argv);
        _exit(127);
    }
    close(fd);
    if (d->pid < 0)
        return -errno;
    for (int i = 0; i < 1000; i++) {
        FILE *f = fopen(d->log, "r");
        char line[512];
        while (f && fgets(line, sizeof line, f)) {
            const char *p = strstr(line, "listening on ");
            if (p)
                d->port = atoi(strrchr(p, ':') + 1);
        }
        if (f)
            fclose(f);
        if (d->port) {
            char *body = NULL;
            int st = http_get("127.0.0.1", d->port, "/healthz", NULL, &body, 2000);
            free(body);
            if (st == 200)
                return 0;
        }
        if (waitpid(d->pid, NULL, WNOHANG) == d->pid)
            break;
        nanosleep(&(struct timespec){0, 20 * 1000 * 1000}, NULL);
    }
    fprintf(stderr, "loadgen: kvpd did not start; see %s\n", d->log);
    return -EIO;
}

static long peak_rss_kib(int pid)
{
    char path[64], line[256];
    snprintf(path, sizeof path, "/proc/%d/status", pid);
    FILE *f = fopen(path, "r");
    long kib = -1;
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "VmHWM:", 6))
            kib = atol(line + 6);
    if (f)
        fclose(f);
    return kib;
}

static int stop(daemon_proc *d)
{
    int status = 0;
    kill(d->pid, SIGTERM);
    waitpid(d->pid, &status, 0);
    unlink(d->log);
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* N sessions x M turns at once; prints its table unless quiet. */
static int load(const opts *o, int port, int pid, int quiet, load_result *res)
{
    session_run *runs = calloc((size_t)o->sessions, sizeof *runs);
    pthread_t *th = calloc((size_t)o->sessions, sizeof *th);
    if (!runs || !th)
        return -ENOMEM;
    double t0 = now_ms();
    for (int i = 0; i < o->sessions; i++) {
        runs[i] = (session_run){.o = o, .port = port, .index = i};
        if (pthread_create(&th[i], NULL, run_session, &runs[i]) != 0)
            return -EAGAIN;
    }
    samples ttft = {0}, itl = {0}, first = {0};
    long tokens = 0, prefilled[2] = {0, 0};
    int failed = 0;
    for (int i = 0; i < o->sessions; i++) {
        pthread_join(th[i], NULL);
        for (size_t k = 0; k < runs[i].ttft.n; k++)
            add(&ttft, runs[i].ttft.v[k]);
        for (size_t k = 0; k < runs[i].itl.n; k++)
            add(&itl, runs[i].itl.v[k]);
        if (runs[i].ttft.n)
            add(&first, runs[i].ttft_first);
        tokens += runs[i].tokens;
        prefilled[0] += runs[i].prefilled[0];
        prefilled[1] += runs[i].prefilled[1];
        failed += runs[i].failed;
        free(runs[i].ttft.v);
        free(runs[i].itl.v);
    }
    double secs = (now_ms() - t0) / 1e3;
    if (res)
        *res = (load_result){tokens / secs, pct(&ttft, 50), pct(&ttft, 99),
                             pct(&first, 50), pct(&first, 99),
                             (double)(tokens + prefilled[0] + prefilled[1]) / secs,
                             (double)prefilled[0] / o->sessions,
                             o->turns > 1 ? (double)prefilled[1] / o->sessions / (o->turns - 1) : 0};
    if (quiet)
        goto out;
    printf("| sessions x turns | %d x %d (max_tokens %d) |\n", o->sessions, o->turns, o->max_tokens);
    printf("| failed sessions | %d |\n", failed);
    printf("| tokens generated | %ld in %.2f s |\n", tokens, secs);
    printf("| aggregate tokens/s | %.0f |\n", tokens / secs);
    printf("| processed tokens/s (prompt + reply) | %.0f (%ld prompt tokens) |\n",
           (double)(tokens + prefilled[0] + prefilled[1]) / secs, prefilled[0] + prefilled[1]);
    printf("| time to first token p50 / p99 | %.2f / %.2f ms |\n", pct(&ttft, 50), pct(&ttft, 99));
    printf("| first messages' time to first token p50 / p99 | %.2f / %.2f ms |\n", pct(&first, 50),
           pct(&first, 99));
    printf("| inter-token latency p50 / p99 | %.3f / %.3f ms |\n", pct(&itl, 50), pct(&itl, 99));
    if (pid > 0)
        printf("| kvpd peak RSS | %.1f MiB |\n", peak_rss_kib(pid) / 1024.0);
out:
    free(ttft.v);
    free(itl.v);
    free(first.v);
    free(runs);
    free(th);
    return failed ? -EIO : 0;
}

/* Median server-side ttft at turn 10 over `reps` single-session conversations. */
static double turn10_ttft(const opts *o, int reuse)
{
    daemon_proc d;
    if (spawn(o, reuse, &d) < 0)
        return -1;
    opts one = *o;
    one.turns = 10;
    samples s = {0};
    for (int r = 0; r < o->reps; r++) {
        session_run run = {.o = &one, .port = d.port, .index = r};
        run_session(&run);
        if (!run.failed)
            add(&s, run.ttft_turn10);
        free(run.ttft.v);
        free(run.itl.v);
    }
    stop(&d);
    double med = s.n ? pct(&s, 50) : -1;
    free(s.v);
    return med;
}

/* The load at each concurrency level on one daemon, after a warm-up turn: aggregate
 * tokens/s (reply, processed) and TTFT against the first level, as a table and (o->svg)
 * a plot. */
static int sweep(const opts *o)
{
    daemon_proc d;
    if (spawn(o, 1, &d) < 0)
        return 1;
    opts one = *o;
    one.sessions = 1;
    one.turns = 1;
    int rc = load(&one, d.port, d.pid, 1, NULL);   /* warm-up: page in the weights */
    load_result res[MAX_LEVELS];
    double x[MAX_LEVELS], tok_ratio[MAX_LEVELS], proc_ratio[MAX_LEVELS], p99_ratio[MAX_LEVELS];
    printf("| sessions | aggregate tok/s | x 1st | processed tok/s | x 1st | TTFT p50 ms "
           "| TTFT p99 ms | p99 x 1st | first messages: TTFT p50 ms | TTFT p99 ms | p99 x 1st |\n"
           "|---|---|---|---|---|---|---|---|---|---|---|\n");
    for (int i = 0; i < o->n_levels && rc == 0; i++) {
        opts lv = *o;
        lv.sessions = o->levels[i];
        rc = load(&lv, d.port, d.pid, 1, &res[i]);
        x[i] = o->levels[i];
        tok_ratio[i] = res[i].tok_s / res[0].tok_s;
        proc_ratio[i] = res[i].processed_s / res[0].processed_s;
        p99_ratio[i] = res[i].ttft_p99 / res[0].ttft_p99;
        printf("| %d | %.1f | %.2f | %.1f | %.2f | %.1f | %.1f | %.2f | %.1f | %.1f | %.2f |\n",
               o->levels[i], res[i].tok_s, tok_ratio[i], res[i].processed_s, proc_ratio[i],
               res[i].ttft_p50, res[i].ttft_p99, p99_ratio[i], res[i].first_p50,
               res[i].first_p99, res[i].first_p99 / res[0].first_p99);
        fflush(stdout);
    }
    printf("(%d turns of %d tokens per session; prompts prefilled: %.1f tokens at the first "
           "turn, %.1f at later ones; kvpd peak RSS %.1f MiB; ", o->turns, o->max_tokens,
           rc == 0 ? res[0].prompt_first : 0, rc == 0 ? res[0].prompt_later : 0,
           peak_rss_kib(d.pid) / 1024.0);
    if (o->stagger_ms > 0)
        printf("session i starts at i x %d ms)\n", o->stagger_ms);
    else
        printf("every session's first message at once)\n");
    int st = stop(&d);
    if (st != 0)
        fprintf(stderr, "loadgen: kvpd exited with %d\n", st);
    if (rc == 0 && o->svg) {
        char title[160], err[256];
        snprintf(title, sizeof title, "%s: against %d session%s", o->label ? o->label : "kvpd",
                 o->levels[0], o->levels[0] == 1 ? "" : "s");
        kvp_svg_series series[3] = {{"aggregate tokens/s (reply)", tok_ratio, 0, 0, 1},
                                    {"processed tokens/s (prompt + reply)", proc_ratio, 2, 0, 0},
                                    {"TTFT p99", p99_ratio, 1, 0, 0}};
        kvp_svg_plot plot = {title, "concurrent sessions", "ratio to the first level", x,
                             o->n_levels, 1, series, 3, 0};
        if (kvp_svg_write(o->svg, &plot, err, sizeof err) < 0) {
            fprintf(stderr, "loadgen: %s\n", err);
            rc = -EIO;
        }
    }
    return rc < 0 || st != 0 ? 1 : 0;
}

/* "1,4,8": increasing positive levels. */
static int arg_levels(const char *v, opts *o)
{
    o->n_levels = 0;
    for (const char *p = v;;) {
        char *end;
        long x = strtol(p, &end, 10);
        if (end == p || x < 1 || x > 4096 || o->n_levels == MAX_LEVELS ||
            (o->n_levels && x <= o->levels[o->n_levels - 1]) || (*end && *end != ','))
            return -1;
        o->levels[o->n_levels++] = (int)x;
        if (!*end)
            return 0;
        p = end + 1;
    }
}

static int arg_int(const char *v, int *out)
{
    char *end;
    long x = strtol(v, &end, 10);
    if (*end || x < 0 || x > 1000000)
        return -1;
    *out = (int)x;
    return 0;
}

int main(int argc, char **argv)
{
    opts o = {.kvpd = "build/daemon/kvpd", .sessions = 16, .turns = 10, .max_tokens = 32,
              .workers = 0, .budget = 256, .reps = 5, .temperature = "0"};
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        int bad = !v;
        if (!strcmp(a, "--help")) {
            printf("usage: loadgen [--kvpd PATH] [--model M] [--tokenizer T] [--sessions N]\n"
                   "               [--turns M] [--max-tokens K] [--workers W] [--budget B]\n"
                   "               [--reps R] [--port P [--pid PID]]\n"
                   "               [--concurrency 1,4,8,16,32 [--svg PATH] [--label NAME]]\n"
                   "               [--stagger-ms S] [--system-words N] [--temperature T]\n"
                   "               [--top-p P]\n");
            return 0;
        } else if (bad) {
        } else if (!strcmp(a, "--kvpd")) {
            o.kvpd = v;
        } else if (!strcmp(a, "--model")) {
            o.model = v;
        } else if (!strcmp(a, "--tokenizer")) {
            o.tokenizer = v;
        } else if (!strcmp(a, "--sessions")) {
            bad = arg_int(v, &o.sessions) || o.sessions < 1;
        } else if (!strcmp(a, "--turns")) {
            bad = arg_int(v, &o.turns) || o.turns < 1;
        } else if (!strcmp(a, "--max-tokens")) {
            bad = arg_int(v, &o.max_tokens) || o.max_tokens < 1;
        } else if (!strcmp(a, "--workers")) {
            bad = arg_int(v, &o.workers);
        } else if (!strcmp(a, "--budget")) {
            bad = arg_int(v, &o.budget);
        } else if (!strcmp(a, "--reps")) {
            bad = arg_int(v, &o.reps) || o.reps < 1;
        } else if (!strcmp(a, "--port")) {
            bad = arg_int(v, &o.port);
        } else if (!strcmp(a, "--pid")) {
            bad = arg_int(v, &o.pid);
        } else if (!strcmp(a, "--concurrency")) {
            bad = arg_levels(v, &o);
        } else if (!strcmp(a, "--system-words")) {
            bad = arg_int(v, &o.system_words) || o.system_words > 4096;
        } else if (!strcmp(a, "--stagger-ms")) {
            bad = arg_int(v, &o.stagger_ms) || o.stagger_ms > 60000;
        } else if (!strcmp(a, "--temperature")) {
            char *end;
            double t = strtod(v, &end);
            bad = *end || end == v || !(t >= 0 && t <= 100);
            o.temperature = v;
        } else if (!strcmp(a, "--top-p")) {
            char *end;
            double t = strtod(v, &end);
            bad = *end || end == v || !(t > 0 && t <= 1);
            o.top_p = v;
        } else if (!strcmp(a, "--svg")) {
            o.svg = v;
        } else if (!strcmp(a, "--label")) {
            o.label = v;
        } else {
            bad = 1;
        }
        if (bad) {
            fprintf(stderr, "loadgen: bad option %s (see --help)\n", a);
            return 2;
        }
        i++;
    }
    signal(SIGPIPE, SIG_IGN);
    if (o.n_levels)
        return sweep(&o);
    printf("| measure | value |\n|---|---|\n");
    if (o.port) {
        return load(&o, o.port, o.pid, 0, NULL) < 0 ? 1 : 0;
    }
    daemon_proc d;
    if (spawn(&o, 1, &d) < 0)
        return 1;
    int rc = load(&o, d.port, d.pid, 0, NULL);
    int st = stop(&d);
    if (st != 0)
        fprintf(stderr, "loadgen: kvpd exited with %d\n", st);
    double reuse = turn10_ttft(&o, 1), full = turn10_ttft(&o, 0);
    printf("| turn-10 time to first token, cache reuse | %.3f ms |\n", reuse);
    printf("| turn-10 time to first token, re-prefill transcript | %.3f ms |\n", full);
    if (reuse > 0 && full > 0)
        printf("| re-prefill / reuse | %.1fx |\n", full / reuse);
    return rc < 0 || st != 0 || reuse < 0 || full < 0 ? 1 : 0;
}
