/* Snapshots in the state directory: written atomically (temporary file, fsync, rename),
 * read back with a file that fails validation moved aside so that it is reported once
 * and never retried, existence, removal and the sweep of interrupted writes. */
#include "store/snapshot.h"
#include "store/snapshot_impl.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "base/bytes.h"
#include "base/checksum.h"
#include "base/fileio.h"

int kvp_snap_open_dir(const char *dir, char *err, size_t errlen)
{
    int fd = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0)
        return kvp_snap_sys_err("open state directory", dir, err, errlen);
    return fd;
}

int kvp_snap_write_file(const char *tmp, const char *final, const void *const *parts,
                        const size_t *lens, int n, char *err, size_t errlen)
{
    /* O_TRUNC: a .tmp left by a crash is simply overwritten. A FIFO in its place fails
     * (ENXIO: the open does not block) instead of blocking; it is no regular file anyway. */
    struct stat st;
    int rc = 0, fd = kvp_open_regular(tmp, O_WRONLY | O_CREAT | O_TRUNC, &st);
    if (fd == KVP_E_NOT_REGULAR) {
        snprintf(err, errlen, "%s: not a regular file", tmp);
        return -EINVAL;
    }
    if (fd < 0)
        return kvp_snap_sys_fail(fd, "create", tmp, err, errlen);
    for (int i = 0; i < n && rc == 0; i++)
        if ((rc = kvp_write_all(fd, parts[i], lens[i])) < 0)
            rc = kvp_snap_sys_fail(rc, "write", tmp, err, errlen);
    if (rc == 0 && fsync(fd) < 0)
        rc = kvp_snap_sys_err("fsync", tmp, err, errlen);
    if (close(fd) < 0 && rc == 0)
        rc = kvp_snap_sys_err("close", tmp, err, errlen);
    if (rc == 0 && rename(tmp, final) < 0)
        rc = kvp_snap_sys_err("rename to", final, err, errlen);
    if (rc < 0)
        unlink(tmp);
    return rc;
}

int kvp_snapshot_write(const char *dir, const kvp_snapshot *snap, char *err, size_t errlen)
{
    int rc = kvp_snap_check(snap, err, errlen);
    if (rc < 0)
        return rc;
    char tmp[PATH_MAX], final[PATH_MAX];
    if ((rc = kvp_snap_path(tmp, sizeof tmp, dir, snap->id, ".snap.tmp", err, errlen)) < 0 ||
        (rc = kvp_snap_path(final, sizeof final, dir, snap->id, ".snap", err, errlen)) < 0)
        return rc;
    kvp_wbuf w;
    if (kvp_snap_encode_prefix(snap, &w) < 0) {
        snprintf(err, errlen, "snapshot %s: out of memory", snap->id);
        return -ENOMEM;
    }
    uint64_t sum = kvp_fnv1a(kvp_fnv1a(KVP_FNV1A_INIT, w.p, w.n), snap->cache, snap->cache_len);
    unsigned char trailer[TRAILER_BYTES];
    kvp_put_u64(trailer, sum);

    int dfd = kvp_snap_open_dir(dir, err, errlen);
    if (dfd < 0) {
        free(w.p);
        return dfd;
    }
    const void *parts[] = {w.p, snap->cache, trailer};
    const size_t lens[] = {w.n, snap->cache_len, sizeof trailer};
    if ((rc = kvp_snap_write_file(tmp, final, parts, lens, 3, err, errlen)) < 0)
        goto out;
    /* The journal's records are all in the new snapshot now (a crash before this unlink
     * leaves them for replay to skip). The rename is durable once the directory is. */
    char journal[PATH_MAX];
    if (kvp_snap_path(journal, sizeof journal, dir, snap->id, ".journal", err, errlen) == 0 &&
        unlink(journal) < 0 && errno != ENOENT)
        rc = kvp_snap_sys_err("remove", journal, err, errlen);
    if (rc == 0 && fsync(dfd) < 0)
        rc = kvp_snap_sys_err("fsync state directory", dir, err, errlen);
out:
    close(dfd);
    free(w.p);
    return rc;
}

void kvp_snap_move_aside(const char *path, char *err, size_t errlen)
{
    char bad[PATH_MAX + 64];
    long long now = (long long)time(NULL);
    int w = snprintf(bad, sizeof bad, "%s.bad-%lld", path, now);
    struct stat st;
    for (int k = 1; k < 1000 && lstat(bad, &st) == 0; k++)
        w = snprintf(bad, sizeof bad, "%s.bad-%lld-%d", path, now, k);
    size_t used = strlen(err);
    if (w > 0 && (size_t)w < sizeof bad && rename(path, bad) == 0)
        snprintf(err + used, errlen - used, "; moved aside to %s", bad);
    else
        snprintf(err + used, errlen - used, "; could not move it aside: %s",
                 w > 0 && (size_t)w < sizeof bad ? strerror(errno) : "path too long");
}

int kvp_snapshot_read(const char *dir, const char *id, kvp_snapshot *out,
                      char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    int rc = kvp_snap_check_id(id, err, errlen);
    char path[PATH_MAX];
    if (rc < 0 || (rc = kvp_snap_path(path, sizeof path, dir, id, ".snap", err, errlen)) < 0)
        return rc;
    /* Non-blocking: a FIFO in its place must not hold the worker in open(). */
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd == -ENOENT) {
        snprintf(err, errlen, "no snapshot for session %s in %s", id, dir);
        return -ENOENT;
    }
    if (fd == -ELOOP || fd == KVP_E_NOT_REGULAR) {
        snprintf(err, errlen, "snapshot %s: %s", path,
                 fd == -ELOOP ? "a symbolic link, not a snapshot" : "not a regular file");
        kvp_snap_move_aside(path, err, errlen);
        return -EBADMSG;
    }
    if (fd < 0)
        return kvp_snap_sys_fail(fd, "open", path, err, errlen);
    size_t len = (size_t)st.st_size;
    unsigned char *buf = malloc(len ? len : 1);
    if (!buf) {
        close(fd);
        snprintf(err, errlen, "snapshot %s: out of memory (%zu bytes)", path, len);
        return -ENOMEM;
    }
    /* A file that shrank under us reads short: validation reports it as truncated. */
    long long got = kvp_read_full(fd, buf, len);
    close(fd);
    if (got < 0) {
        free(buf);
        return kvp_snap_sys_fail((int)got, "read", path, err, errlen);
    }
    char why[160];
    const char *bad = kvp_snap_parse(buf, (size_t)got, id, out, why, sizeof why);
    if (!bad)
        return 0;
    free(buf);
    kvp_snapshot_free(out);
    if (bad == kvp_snap_oom) {
        snprintf(err, errlen, "snapshot %s: out of memory", path);
        return -ENOMEM;
    }
    snprintf(err, errlen, "snapshot %s: %s", path, bad);
    kvp_snap_move_aside(path, err, errlen);
    return -EBADMSG;
}

void kvp_snapshot_free(kvp_snapshot *s)
{
    for (int i = 0; i < s->n_msgs; i++)
        free(s->msgs[i].text);
    free(s->msgs);
    free(s->system);
    free(s->tokens);
    free(s->cache);
    memset(s, 0, sizeof *s);
}

int kvp_snapshot_exists(const char *dir, const char *id)
{
    char path[PATH_MAX], err[256];
    struct stat st;
    return kvp_snapshot_id_valid(id) &&
           kvp_snap_path(path, sizeof path, dir, id, ".snap", err, sizeof err) == 0 &&
           stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

int kvp_snapshot_remove(const char *dir, const char *id, char *err, size_t errlen)
{
    int rc = kvp_snap_check_id(id, err, errlen);
    char path[PATH_MAX], tmp[PATH_MAX];
    if (rc < 0 || (rc = kvp_snap_path(path, sizeof path, dir, id, ".snap", err, errlen)) < 0 ||
        (rc = kvp_snap_path(tmp, sizeof tmp, dir, id, ".snap.tmp", err, errlen)) < 0)
        return rc;
    if (unlink(path) < 0 && errno != ENOENT)
        return kvp_snap_sys_err("remove", path, err, errlen);
    if (unlink(tmp) < 0 && errno != ENOENT)
        return kvp_snap_sys_err("remove", tmp, err, errlen);
    char journal[PATH_MAX];
    if ((rc = kvp_snap_path(journal, sizeof journal, dir, id, ".journal", err, errlen)) < 0)
        return rc;
    if (unlink(journal) < 0 && errno != ENOENT)
        return kvp_snap_sys_err("remove", journal, err, errlen);
    /* Durable, so that a removed session does not come back after a crash. */
    int dfd = kvp_snap_open_dir(dir, err, errlen);
    if (dfd < 0)
        return dfd;
    if (fsync(dfd) < 0)
        rc = kvp_snap_sys_err("fsync state directory", dir, err, errlen);
    close(dfd);
    return rc;
}

int kvp_snapshot_clean(const char *dir, char *err, size_t errlen)
{
    DIR *d = opendir(dir);
    if (!d)
        return kvp_snap_sys_err("open state directory", dir, err, errlen);
    static const char suffix[] = ".snap.tmp";
    const size_t sl = sizeof suffix - 1;
    int removed = 0, rc = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n <= sl || memcmp(e->d_name + n - sl, suffix, sl) != 0)
            continue;
        if (unlinkat(dirfd(d), e->d_name, 0) == 0) {
            removed++;
        } else if (errno != ENOENT) {
            rc = kvp_snap_sys_err("remove", e->d_name, err, errlen);
            break;
        }
    }
    closedir(d);
    return rc < 0 ? rc : removed;
}
