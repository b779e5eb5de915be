#include "tests/model/testutil.h"

#include "model/gguf.h"
#include "model/grammar.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *join(const char *env, const char *fallback, const char *rel)
{
    static char bufs[8][1024];
    static int next;
    char *b = bufs[next++ % 8];
    const char *root = getenv(env);
    snprintf(b, sizeof bufs[0], "%s/%s", root ? root : fallback, rel);
    return b;
}

const char *tu_shared(const char *rel) { return join("KVP_SHARED", "../shared", rel); }
const char *tu_build(const char *rel) { return join("KVP_BUILD", "build", rel); }

char *tu_slurp(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    cr_assert(f, "cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc((size_t)n + 1);
    cr_assert(buf);
    cr_assert_eq(fread(buf, 1, (size_t)n, f), (size_t)n);
    buf[n] = 0;
    fclose(f);
    if (len)
        *len = (size_t)n;
    return buf;
}

/* Every file tu_write_tmp made in this process, removed when the test process exits
 * (Criterion runs each test in its own process; a pid check keeps a forked child from
 * removing its parent's files). */
static struct {
    char (*paths)[64];
    int n, cap;
    pid_t owner;
} tmp_files;

void tu_remove_tmp_files(void)
{
    if (tmp_files.owner != getpid())
        return;
    for (int i = 0; i < tmp_files.n; i++)
        unlink(tmp_files.paths[i]);
    free(tmp_files.paths);
    tmp_files.paths = NULL;
    tmp_files.n = tmp_files.cap = 0;
}

const char *tu_write_tmp(const void *buf, size_t len)
{
    static char paths[4][64];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "/tmp/kvp-test-XXXXXX");
    int fd = mkstemp(p);
    cr_assert(fd >= 0);
    cr_assert_eq(write(fd, buf, len), (ssize_t)len);
    close(fd);
    if (tmp_files.owner != getpid()) {
        /* first file of this process (or of a child that inherited the parent's list) */
        tmp_files.paths = NULL;
        tmp_files.n = tmp_files.cap = 0;
        tmp_files.owner = getpid();
        atexit(tu_remove_tmp_files);
    }
    if (tmp_files.n == tmp_files.cap) {
        tmp_files.cap = tmp_files.cap ? 2 * tmp_files.cap : 16;
        tmp_files.paths = realloc(tmp_files.paths, (size_t)tmp_files.cap * sizeof *tmp_files.paths);
        cr_assert(tmp_files.paths);
    }
    snprintf(tmp_files.paths[tmp_files.n++], sizeof tmp_files.paths[0], "%s", p);
    return p;
}

int tu_run(const char *cmd, char **out)
{
    FILE *p = popen(cmd, "r");
    cr_assert(p, "popen %s", cmd);
    size_t cap = 4096, n = 0;
    char *buf = malloc(cap);
    size_t r;
    while ((r = fread(buf + n, 1, cap - n - 1, p)) > 0) {
        n += r;
        if (cap - n < 2) {
            cap *= 2;
            buf = realloc(buf, cap);
        }
    }
    buf[n] = 0;
    int st = pclose(p);
    if (out)
        *out = buf;
    else
        free(buf);
    return WIFEXITED(st) ? WEXITSTATUS(st) : -1;
}

/* Writes w into a heap buffer with the given fill callback. */
uint8_t *tu_gguf_to_mem(kvp_gguf_writer *w, int (*fill)(void *, uint64_t, void *, uint64_t),
                        size_t *len)
{
    char *buf = NULL;
    FILE *f = open_memstream(&buf, len);
    cr_assert(f);
    char err[256];
    int rc = kvp_gguf_writer_write(w, f, fill, NULL, err, sizeof err);
    fclose(f);
    cr_assert_eq(rc, 0, "write: %s", err);
    return (uint8_t *)buf;
}

int tu_gguf_fill_pattern(void *ctx, uint64_t i, void *buf, uint64_t n)
{
    (void)ctx;
    uint8_t *b = buf;
    for (uint64_t j = 0; j < n; j++)
        b[j] = (uint8_t)(j * 7 + i * 31 + 1);
    return 0;
}

int tu_grammar_whole(struct kvp_grammar *g, const char *doc)
{
    kvp_gmatch m;
    cr_assert_eq(kvp_gmatch_init(&m, g), 0);
    int ok = kvp_gmatch_accept(&m, doc, strlen(doc)) == 0 && kvp_gmatch_complete(&m);
    kvp_gmatch_free(&m);
    return ok;
}
