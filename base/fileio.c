#include "base/fileio.h"

#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <unistd.h>

/* open(path, flags | O_CLOEXEC | O_NONBLOCK, 0600) and fstat: a regular file's
 * descriptor, or a negative errno or KVP_E_NOT_REGULAR with nothing left open. */
static int open_checked(const char *path, int flags, struct stat *st)
{
    int fd = open(path, flags | O_CLOEXEC | O_NONBLOCK, 0600);
    if (fd < 0)
        return -errno;
    if (fstat(fd, st) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    if (!S_ISREG(st->st_mode)) {
        close(fd);
        return KVP_E_NOT_REGULAR;
    }
    return fd;
}

int kvp_open_regular(const char *path, int flags, struct stat *st)
{
    return open_checked(path, flags | O_NOFOLLOW, st);
}

int kvp_open_input(const char *path, struct stat *st)
{
    int fd = open_checked(path, O_RDONLY, st);
    if (fd < 0)
        return fd;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || fcntl(fd, F_SETFL, fl & ~O_NONBLOCK) < 0) {
        int e = errno;
        close(fd);
        return -e;
    }
    return fd;
}

FILE *kvp_fopen_input(const char *path)
{
    struct stat st;
    int fd = kvp_open_input(path, &st);
    if (fd < 0) {
        errno = -fd;
        return NULL;
    }
    FILE *f = fdopen(fd, "rb");
    if (!f) {
        int e = errno;
        close(fd);
        errno = e;
    }
    return f;
}

const char *kvp_fileio_strerror(int rc)
{
    return rc == KVP_E_NOT_REGULAR ? "not a regular file (a FIFO, device or directory?)"
                                   : strerror(-rc);
}

int kvp_write_all(int fd, const void *buf, size_t n)
{
    const unsigned char *p = buf;
    while (n) {
        ssize_t k = write(fd, p, n);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        p += k;
        n -= (size_t)k;
    }
    return 0;
}

long long kvp_read_full(int fd, void *buf, size_t n)
{
    unsigned char *p = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t k = read(fd, p + got, n - got);
        if (k < 0 && errno == EINTR)
            continue;
        if (k < 0)
            return -errno;
        if (k == 0)
            break;
        got += (size_t)k;
    }
    return (long long)got;
}
