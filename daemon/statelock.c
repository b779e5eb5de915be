#include "daemon/statelock.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"

/* The holder's pid as the file says (a decimal number and a newline); 0 when it does
 * not say (it is still writing it, or the content is not a pid). */
static long holder_pid(int fd)
{
    char buf[32];
    ssize_t n = pread(fd, buf, sizeof buf - 1, 0);
    if (n <= 0)
        return 0;
    buf[n] = '\0';
    long pid = 0;
    for (const char *p = buf; *p >= '0' && *p <= '9'; p++) {
        pid = pid * 10 + (*p - '0');
        if (pid > 1L << 30)
            return 0;
    }
    return pid;
}

int kvpd_statelock_take(const char *dir, char *err, size_t errlen)
{
    char path[4200];
    if (snprintf(path, sizeof path, "%s/%s", dir, KVPD_STATELOCK_NAME) >= (int)sizeof path) {
        snprintf(err, errlen, "state_dir %s: the path is too long", dir);
        return -ENAMETOOLONG;
    }
    struct stat st;
    int fd = kvp_open_regular(path, O_RDWR | O_CREAT, &st);
    if (fd < 0) {
        snprintf(err, errlen, "state_dir %s: cannot open its lock %s: %s", dir, path,
                 kvp_fileio_strerror(fd));
        return fd;
    }
    int rc;
    do
        rc = flock(fd, LOCK_EX | LOCK_NB);
    while (rc < 0 && errno == EINTR);
    if (rc < 0) {
        int e = errno;
        if (e == EWOULDBLOCK) {
            long pid = holder_pid(fd);
            if (pid > 0)
                snprintf(err, errlen, "state_dir %s is in use by another kvpd (pid %ld, "
                         "%s): one daemon per state directory", dir, pid, path);
            else
                snprintf(err, errlen, "state_dir %s is in use by another kvpd (pid unknown, "
                         "%s): one daemon per state directory", dir, path);
            close(fd);
            return -EBUSY;
        }
        snprintf(err, errlen, "state_dir %s: cannot lock %s: %s", dir, path, strerror(e));
        close(fd);
        return -e;
    }
    char pid[32];
    int n = snprintf(pid, sizeof pid, "%ld\n", (long)getpid());
    rc = ftruncate(fd, 0) < 0 ? -errno : kvp_write_all(fd, pid, (size_t)n);
    if (rc < 0) {
        int e = -rc;
        snprintf(err, errlen, "state_dir %s: cannot write its lock %s: %s", dir, path,
                 strerror(e));
        close(fd);
        return -e;
    }
    return fd;
}

void kvpd_statelock_release(int fd)
{
    if (fd >= 0)
        close(fd);
}
