/* An append-only hint file in the state directory: STATE_DIR/<name>, one text line per
 * saved session, the last line of an id winning. Workers append a line (O_APPEND, one
 * write per line, one appending thread of this process at a time); the file is read and
 * rewritten compacted at start (by its user) and again by an append once it is both past
 * compact_min bytes and twice its compacted size (so the cost per append stays constant
 * and the file within about twice its live lines). A hint, never fsynced: a lost or
 * damaged line costs its user a lookup, never a wrong answer.
 *
 * This room owns the file: its path, the bounded line reader (a line longer than
 * line_max, the torn last line and a line holding a NUL byte are skipped and counted),
 * the rewrite through <name>.tmp renamed over the file, the append with its compaction
 * and the lock. Its user owns the lines: it parses them in a read callback, formats them
 * for an append or a rewrite, and decides what a compaction keeps (its `compact`
 * callback: read, keep, rewrite). Files open like the snapshots (kvp_open_regular): no
 * links, no blocking on a FIFO, regular files only. */
#ifndef KVP_HINTFILE_H
#define KVP_HINTFILE_H

#include <limits.h>
#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

/* One hint file; a user keeps one, static, made with KVP_HINTFILE_INIT. */
typedef struct kvp_hintfile {
    const char *name;     /* the file's name in the state directory */
    const char *what;     /* what it is, for messages ("transcript index") */
    size_t line_max;      /* the longest line read back, its newline excluded */
    off_t compact_min;    /* no compaction below this many bytes */
    /* Reads the file in dir and rewrites it compacted (its user's load, into a table it
     * then frees): >= 0, or a negative code with a message. Called by an append, with
     * the append lock held. */
    int (*compact)(const char *dir, char *err, size_t errlen);
    /* this process's appends and compactions, one at a time (a compaction renames a new
     * file over the one an append writes to) */
    pthread_mutex_t lock;
    char dir[PATH_MAX];   /* the directory `compacted` was measured in */
    off_t compacted;      /* the file's size after the last compaction (or as first seen) */
} kvp_hintfile;

#define KVP_HINTFILE_INIT(name_, what_, line_max_, compact_min_, compact_)                  \
    {                                                                                      \
        .name = (name_), .what = (what_), .line_max = (line_max_),                         \
        .compact_min = (compact_min_), .compact = (compact_),                              \
        .lock = PTHREAD_MUTEX_INITIALIZER                                                  \
    }

/* <dir>/<name><suffix> into buf[0..n): 0, or -ENAMETOOLONG with a message. */
int kvp_hintfile_path(const kvp_hintfile *hf, const char *dir, const char *suffix, char *buf,
                      size_t n, char *err, size_t errlen);

/* What a read callback returns for a line that is not one of its own. */
#define KVP_HINTFILE_DAMAGED 1
/* One line, line[0..len) without its newline (no NUL inside, len <= line_max): 0 (taken),
 * KVP_HINTFILE_DAMAGED (skipped and counted), or a negative code that stops the read. */
typedef int (*kvp_hintfile_line_fn)(void *ctx, const char *line, size_t len);
/* Hands each line of <dir>/<name> to fn in file order, never holding more than line_max
 * bytes of one; *damaged counts the lines skipped (by the reader or by fn). A missing
 * file (or directory) is an empty one: 0 and err untouched. 0, or a negative code with a
 * message (what fn returned, or why the file could not be opened). */
int kvp_hintfile_read(const kvp_hintfile *hf, const char *dir, kvp_hintfile_line_fn fn,
                      void *ctx, int *damaged, char *err, size_t errlen);

/* Where a rewrite's lines go (its fields are the rewrite's own). */
typedef struct kvp_hintfile_out {
    int fd, rc;
} kvp_hintfile_out;
/* Writes one line (with its newline) to the rewrite: 0, or the first write's error (the
 * lines after it are dropped and the rewrite fails). */
int kvp_hintfile_put(kvp_hintfile_out *out, const char *line, size_t len);
/* fn puts every line of the compacted file (kvp_hintfile_put): 0 or a negative code. */
typedef int (*kvp_hintfile_write_fn)(void *ctx, kvp_hintfile_out *out);
/* Writes <dir>/<name>.tmp with fn's lines and renames it over <dir>/<name>; on failure
 * the temporary file is removed and the old file left. 0, or a negative code with a
 * message. */
int kvp_hintfile_rewrite(const kvp_hintfile *hf, const char *dir, kvp_hintfile_write_fn fn,
                         void *ctx, char *err, size_t errlen);

/* Appends line[0..len) (one whole line, with its newline) to <dir>/<name> under the
 * lock, then compacts the file through hf->compact when it has grown past both
 * compact_min and twice its compacted size (a failed compaction is logged and tried
 * again once the file has doubled). 0, or a negative code with a message. */
int kvp_hintfile_append(kvp_hintfile *hf, const char *dir, const char *line, size_t len,
                        char *err, size_t errlen);

#endif
