/* File I/O for the state directory's files (snapshots, journals, the transcript index):
 * open without following links or blocking, write and read whole buffers. */
#ifndef KVP_FILEIO_H
#define KVP_FILEIO_H

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <sys/stat.h>

/* Not a regular file (a directory, FIFO, socket or device in the file's place). */
#define KVP_E_NOT_REGULAR (-EINVAL)

/* open(path, flags | O_CLOEXEC | O_NOFOLLOW | O_NONBLOCK, 0600), then fstat into *st:
 * the descriptor of a regular file, or a negative errno (-ELOOP: a symbolic link; a FIFO
 * never blocks the caller) or KVP_E_NOT_REGULAR, with nothing left open. */
int kvp_open_regular(const char *path, int flags, struct stat *st);
/* Opens a file kvpd only reads (model, tokenizer, policy, config), following symbolic
 * links but never blocking: a FIFO, device or directory in its place is refused
 * (KVP_E_NOT_REGULAR) instead of holding the opener (and with it start, a SIGHUP reload
 * or SIGTERM) until a writer comes. The descriptor (O_RDONLY | O_CLOEXEC) of a regular
 * file, blocking again, with fstat in *st; or a negative errno / KVP_E_NOT_REGULAR. */
int kvp_open_input(const char *path, struct stat *st);
/* The same as a stdio stream ("rb"): NULL with errno set (EINVAL: not a regular file). */
FILE *kvp_fopen_input(const char *path);
/* What a negative code of these functions means, for an error message. */
const char *kvp_fileio_strerror(int rc);
/* Writes all n bytes, again after a short write or EINTR: 0, or -errno. */
int kvp_write_all(int fd, const void *buf, size_t n);
/* Reads until n bytes or the end of the file, again after EINTR: the bytes read (fewer
 * than n when the file ended first), or -errno. */
long long kvp_read_full(int fd, void *buf, size_t n);

#endif
