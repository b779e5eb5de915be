/* File I/O for the state directory's files (snapshots, journals, the transcript index):
 * open without following links or blocking, write and read whole buffers. */
#ifndef KVP_FILEIO_H
#define KVP_FILEIO_H

#include <errno.h>
#include <stddef.h>
#include <sys/stat.h>

/* Not a regular file (a directory, FIFO, socket or device in the file's place). */
#define KVP_E_NOT_REGULAR (-EINVAL)

/* open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600), then fstat into *st:
 * the descriptor of a regular file, or a negative errno (-ELOOP: a symbolic link; a FIFO
 * never blocks the caller) or KVP_E_NOT_REGULAR, with nothing left open. */
int kvp_open_regular(const char *path, int flags, struct stat *st);
/* Writes all n bytes, again after a short write or EINTR: 0, or -errno. */
int kvp_write_all(int fd, const void *buf, size_t n);
/* Reads until n bytes or the end of the file, again after EINTR: the bytes read (fewer
 * than n when the file ended first), or -errno. */
long long kvp_read_full(int fd, void *buf, size_t n);

#endif
