/* The hint file (store/hintfile.h): its path, the bounded line reader, the rewrite through
 * a temporary file, the append with its compaction. */
#include "store/hintfile.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/log.h"

int kvp_hintfile_path(const kvp_hintfile *hf, const char *dir, const char *suffix, char *buf,
                      size_t n, char *err, size_t errlen)
{
    int w = snprintf(buf, n, "%s/%s%s", dir, hf->name, suffix);
    if (w < 0 || (size_t)w >= n) {
        snprintf(err, errlen, "%s path too long in %s", hf->what, dir);
        return -ENAMETOOLONG;
    }
    return 0;
}

static const char *code_text(int rc)
{
    return rc == -ENOMEM ? "out of memory" : kvp_fileio_strerror(rc);
}

/* ---- reading ---- */

/* The next line of f into buf[0..cap) (its newline dropped): 1 and *len, 0 at the end,
 * -1 for a line skipped (longer than cap, holding a NUL byte, or the file's torn last
 * line). Never holds more than cap bytes. */
static int read_line(FILE *f, char *buf, size_t cap, size_t *len)
{
    size_t n = 0;
    int ch, nul = 0;
    while ((ch = getc(f)) != EOF && ch != '\n') {
        if (n < cap)
            buf[n] = (char)ch;
        nul |= ch == '\0';
        n++;
    }
    if (ch == EOF && n == 0)
        return 0;
    *len = n;
    return ch == EOF || n > cap || nul ? -1 : 1;
}

int kvp_hintfile_read(const kvp_hintfile *hf, const char *dir, kvp_hintfile_line_fn fn,
                      void *ctx, int *damaged, char *err, size_t errlen)
{
    char path[PATH_MAX];
    int rc = kvp_hintfile_path(hf, dir, "", path, sizeof path, err, errlen);
    if (rc < 0)
        return rc;
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd == -ENOENT)   /* a fresh state directory */
        return 0;
    FILE *f = fd >= 0 ? fdopen(fd, "r") : NULL;
    /* (one byte more than line_max: a zero line_max still gets a buffer) */
    char *line = f ? malloc(hf->line_max + 1) : NULL;
    if (!line) {
        rc = fd < 0 ? fd : -ENOMEM;
        snprintf(err, errlen, "open %s: %s", path, code_text(rc));
        if (f)
            fclose(f);
        else if (fd >= 0)
            close(fd);
        return rc;
    }
    int got;
    size_t len;
    while (rc == 0 && (got = read_line(f, line, hf->line_max, &len)) != 0) {
        int r = got < 0 ? KVP_HINTFILE_DAMAGED : fn(ctx, line, len);
        if (r == KVP_HINTFILE_DAMAGED)
            (*damaged)++;   /* a torn last line, or bytes that are no line of ours */
        else if (r < 0)
            rc = r;
    }
    if (rc == 0 && ferror(f))
        rc = -EIO;
    free(line);
    fclose(f);
    if (rc < 0)
        snprintf(err, errlen, "reading %s: %s", path, code_text(rc));
    return rc;
}

/* ---- rewriting ---- */

int kvp_hintfile_put(kvp_hintfile_out *out, const char *line, size_t len)
{
    if (out->rc == 0)
        out->rc = kvp_write_all(out->fd, line, len);
    return out->rc;
}

int kvp_hintfile_rewrite(const kvp_hintfile *hf, const char *dir, kvp_hintfile_write_fn fn,
                         void *ctx, char *err, size_t errlen)
{
    char path[PATH_MAX], tmp[PATH_MAX];
    int rc;
    if ((rc = kvp_hintfile_path(hf, dir, "", path, sizeof path, err, errlen)) < 0 ||
        (rc = kvp_hintfile_path(hf, dir, ".tmp", tmp, sizeof tmp, err, errlen)) < 0)
        return rc;
    struct stat st;
    kvp_hintfile_out out = {.fd = kvp_open_regular(tmp, O_WRONLY | O_CREAT | O_TRUNC, &st)};
    if (out.fd < 0) {
        snprintf(err, errlen, "open %s: %s", tmp, kvp_fileio_strerror(out.fd));
        return out.fd;
    }
    rc = fn(ctx, &out);
    if (rc == 0)
        rc = out.rc;
    if (close(out.fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0) {
        snprintf(err, errlen, "rewriting %s: %s", path, code_text(rc));
        unlink(tmp);
    }
    return rc;
}

/* ---- appending ---- */

/* Called with hf->lock held, after an append left the file `size` bytes long. */
static void maybe_compact(kvp_hintfile *hf, const char *dir, const char *path, off_t size)
{
    if (strcmp(hf->dir, dir)) {
        snprintf(hf->dir, sizeof hf->dir, "%s", dir);
        hf->compacted = size;
    }
    if (size < hf->compact_min || size < 2 * hf->compacted)
        return;
    char err[256] = "";
    struct stat st;
    if (hf->compact(dir, err, sizeof err) >= 0) {
        hf->compacted = stat(path, &st) == 0 ? st.st_size : 0;
    } else {
        hf->compacted = size;   /* tried again once it doubled */
        kvpd_log("warning", "%s: compaction failed: %s", hf->what, err);
    }
}

int kvp_hintfile_append(kvp_hintfile *hf, const char *dir, const char *line, size_t len,
                        char *err, size_t errlen)
{
    char path[PATH_MAX];
    int rc = kvp_hintfile_path(hf, dir, "", path, sizeof path, err, errlen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&hf->lock);
    struct stat st;
    int fd = kvp_open_regular(path, O_WRONLY | O_CREAT | O_APPEND, &st);
    if (fd < 0) {
        snprintf(err, errlen, "open %s: %s", path, kvp_fileio_strerror(fd));
        rc = fd;
    } else {
        if ((rc = kvp_write_all(fd, line, len)) < 0)
            snprintf(err, errlen, "append to %s: %s", path, strerror(-rc));
        close(fd);
        if (rc == 0)
            maybe_compact(hf, dir, path, st.st_size + (off_t)len);
    }
    pthread_mutex_unlock(&hf->lock);
    return rc;
}
