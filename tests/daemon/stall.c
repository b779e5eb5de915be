/* A stalled store and a timed token stream for the step loop's tests (see stall.h). */
#include "tests/daemon/stall.h"

#include <criterion/criterion.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

void h_stall_up(h_stall *s)
{
    memset(s, 0, sizeof *s);
    h_redis_up(&s->redis, s->dir, sizeof s->dir, H_REDIS_DEBUG);
    snprintf(s->model, sizeof s->model, "%s/synth.gguf", s->dir);
    char cmd[512];
    snprintf(cmd, sizeof cmd, "%s synth --out %s --dim 256 --hidden 512 --layers 8 --heads 4 "
             "--vocab 2048 --ctx 4096 --seed 7 > /dev/null", h_build("tools/kvp"), s->model);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
}

void h_stall_down(h_stall *s)
{
    h_redis_down(&s->redis, s->dir);
}

void h_stall_kvpd(const h_stall *s, kvpd_proc *d)
{
    char extra[512];
    snprintf(extra, sizeof extra, "--model %s --policy streaming --state-url "
             "redis://127.0.0.1:%d/0 --workers 2 --max-tokens 4096", s->model, s->redis.port);
    cr_assert_eq(kvpd_start(d, extra), 0, "log %s", d->log);
}

int h_stall_sleep(const h_stall *s, double seconds)
{
    char cmd[64];
    snprintf(cmd, sizeof cmd, "DEBUG SLEEP %.1f\r\n", seconds);
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)s->redis.port),
                            .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&a, sizeof a) < 0 ||
        write(fd, cmd, strlen(cmd)) != (ssize_t)strlen(cmd)) {
        if (fd >= 0)
            close(fd);
        cr_assert_fail("DEBUG SLEEP was not sent");
    }
    return fd;
}

static void *read_stream(void *arg)
{
    h_stream *s = arg;
    for (;;) {
        json_t *j = h_read_json(s->c, 30000);
        if (!j)
            break;
        const char *t = json_string_value(json_object_get(j, "type"));
        double now = ws_now_ms();
        int tok = t && !strcmp(t, "token"), end = !t || strcmp(t, "token");
        pthread_mutex_lock(&s->mu);
        if (end) {
            json_t *st = json_object_get(j, "stats");
            snprintf(s->end, sizeof s->end, "%s (stop %s, %s)", t ? t : "?",
                     json_string_value(json_object_get(st, "stop")) ?: "-",
                     json_string_value(json_object_get(j, "message")) ?: "");
            s->done_at = now;
        }
        if (tok && s->n < H_STREAM_MAX)
            s->at[s->n++] = now;
        s->done = end;
        pthread_mutex_unlock(&s->mu);
        json_decref(j);
        if (end)
            break;
    }
    return NULL;
}

void h_stream_start(h_stream *s, ws_client *c)
{
    memset(s, 0, sizeof *s);
    s->c = c;
    cr_assert_eq(pthread_mutex_init(&s->mu, NULL), 0);
    cr_assert_eq(pthread_create(&s->th, NULL, read_stream, s), 0);
}

int h_stream_frames(h_stream *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->n;
    pthread_mutex_unlock(&s->mu);
    return n;
}

double h_stream_gap(h_stream *s, int from, int to, double t0, double t1, int tail, int *ended)
{
    pthread_mutex_lock(&s->mu);
    *ended = s->done;
    double gap = to > from ? s->at[from] - t0 : t1 - t0;
    for (int k = from + 1; k < to; k++)
        if (s->at[k] - s->at[k - 1] > gap)
            gap = s->at[k] - s->at[k - 1];
    double last = to > 0 ? t1 - s->at[to - 1] : t1 - t0;
    if (tail && last > gap)
        gap = last;
    pthread_mutex_unlock(&s->mu);
    return gap;
}

void h_stream_assert_steady(int frames, double gap, double stall_s)
{
    cr_assert_gt(frames, 50, "the stream kept decoding through the stall (%d tokens)", frames);
    cr_assert_lt(gap, stall_s * 1e3 / 4, "the stream's longest gap %.0f ms in a %.1f s stall",
                 gap, stall_s);
}

void h_stream_cancel(h_stream *s)
{
    cr_assert_eq(ws_send_text(s->c, "{\"type\":\"cancel\"}"), 0);
    pthread_join(s->th, NULL);
    pthread_mutex_destroy(&s->mu);
}
