/* One daemon per state directory: <state_dir>/kvpd.lock, held with flock for the
 * process's life and holding its pid, so a second kvpd started on the same directory
 * refuses to start instead of writing the same snapshots and journals. */
#ifndef KVPD_STATELOCK_H
#define KVPD_STATELOCK_H

#include <stddef.h>

#define KVPD_STATELOCK_NAME "kvpd.lock"

/* Takes the lock of dir: the lock file's descriptor (kept open; closing it or exiting
 * releases the lock), its content this process's pid. -EBUSY when another process holds
 * it (err names dir and the holder's pid), another negative errno when the file cannot
 * be opened (a symbolic link, a directory or FIFO in its place is refused). */
int kvpd_statelock_take(const char *dir, char *err, size_t errlen);
/* Releases it (fd < 0: nothing). The file stays: removing it would race a new holder. */
void kvpd_statelock_release(int fd);

#endif
