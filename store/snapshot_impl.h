/* What the snapshot codec (snapshot.c), the state directory's files (snapshot_dir.c) and
 * the journal (journal.c) share; private to store/. */
#ifndef KVP_STORE_SNAPSHOT_IMPL_H
#define KVP_STORE_SNAPSHOT_IMPL_H

#include <stddef.h>

#include "base/bytes.h"
#include "store/snapshot.h"

enum { HEADER_BYTES = 16, SECTION_HEADER_BYTES = 16, TRAILER_BYTES = 8, N_SECTIONS = 5 };

/* The one parse failure that says nothing about the file (compared by address). */
extern const char kvp_snap_oom[];

/* 0, or -EINVAL with a message when id is not a valid session id. */
int kvp_snap_check_id(const char *id, char *err, size_t errlen);
/* <dir>/<id><suffix> into buf[n]; -ENAMETOOLONG with a message. */
int kvp_snap_path(char *buf, size_t n, const char *dir, const char *id, const char *suffix,
                  char *err, size_t errlen);
/* "what path: reason" for the negative errno rc (EIO when there is none); returns it. */
int kvp_snap_sys_fail(int rc, const char *what, const char *path, char *err, size_t errlen);
/* The same for errno. */
int kvp_snap_sys_err(const char *what, const char *path, char *err, size_t errlen);
/* O_DIRECTORY descriptor of the state directory, or -errno with a message. */
int kvp_snap_open_dir(const char *dir, char *err, size_t errlen);
/* Writes parts[0..n) to tmp (created or truncated, never through a link or FIFO),
 * fsyncs it and renames it to final: a crash leaves the old file or the whole new one,
 * never a torn one (the rename is durable once the caller fsyncs the directory). 0, or
 * a negative errno with a message (tmp removed). */
int kvp_snap_write_file(const char *tmp, const char *final, const void *const *parts,
                        const size_t *lens, int n, char *err, size_t errlen);
/* Renames a damaged file to <path>.bad-<unix time>[-N], never to be read again, and
 * appends the outcome to err. */
void kvp_snap_move_aside(const char *path, char *err, size_t errlen);
/* 0, or -EINVAL with a message when a snapshot's fields cannot be encoded. */
int kvp_snap_check(const kvp_snapshot *s, char *err, size_t errlen);
/* Everything before the cache bytes (header, sections); 0 or -1 (out of memory). */
int kvp_snap_encode_prefix(const kvp_snapshot *s, kvp_wbuf *w);
/* A length-prefixed string into dst[max]; 0 or -1. */
int kvp_snap_r_str(kvp_rbuf *r, char *dst, size_t max);
/* NULL, or why a message's text is not valid UTF-8 after repair. */
const char *kvp_snap_repair_utf8(kvp_snapshot_msg *m);
/* NULL, or why the messages' first-token indices are inconsistent. */
const char *kvp_snap_check_first_tokens(const kvp_snapshot *s);
/* Decodes a whole file's bytes into s; NULL, or why not (kvp_snap_oom when memory ran out). */
const char *kvp_snap_parse(unsigned char *buf, size_t len, const char *id, kvp_snapshot *s,
                           char *why, size_t whylen);

#endif
