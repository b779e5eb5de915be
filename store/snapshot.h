/* Session snapshots: one file per session in the state directory, rewritten atomically
 * at the end of every turn so that a restart (or a kill -9) resumes the conversation
 * with its KV cache. Format: docs/snapshot-format.md.
 *
 * Files: <dir>/<id>.snap (the snapshot), <dir>/<id>.journal (turns since), <dir>/<id>.snap.tmp (a write in progress or
 * left by a crash: never read), <dir>/<id>.snap.bad-<unix time>[-N] (a snapshot that
 * failed validation, moved aside for inspection). */
#ifndef KVP_SNAPSHOT_H
#define KVP_SNAPSHOT_H

#include <stddef.h>
#include <stdint.h>

/* Written: 4. Read: 1 (no system text, no bounded history), 2 (the system text), 3 (the
 * bounded history: messages and tokens dropped, each message's first token), 4 (the
 * session's tenant). */
#define KVP_SNAPSHOT_VERSION 4
#define KVP_SNAPSHOT_TENANT_MAX 16
#define KVP_SNAPSHOT_ID_MAX 64
#define KVP_SNAPSHOT_NAME_MAX 127
/* The model hash covers the file size and this many leading bytes: the whole GGUF
 * header and metadata or the llama2.c config and first weights, without reading a
 * multi-gigabyte file at every start. */
#define KVP_SNAPSHOT_MODEL_HASH_BYTES (1u << 20)

/* What the cache and token ids of a snapshot depend on. If any field differs from the
 * running daemon's, the snapshot's cache is unusable and the session is rebuilt from
 * its transcript. */
typedef struct kvp_snapshot_identity {
    char model_name[KVP_SNAPSHOT_NAME_MAX + 1];
    uint64_t model_hash;      /* kvp_snapshot_hash_file(model, KVP_SNAPSHOT_MODEL_HASH_BYTES) */
    char policy_name[KVP_SNAPSHOT_NAME_MAX + 1];
    uint64_t policy_hash;     /* kvp_snapshot_hash_file(policy file, UINT64_MAX); 0: no file */
} kvp_snapshot_identity;

typedef struct kvp_snapshot_msg {
    int user;                 /* 1 user, 0 assistant, 2 tool results (KVP_MESSAGE_TOOL) */
    char *text;               /* read: NUL-terminated copy (may hold NULs: use len) */
    size_t len;
    int64_t first_token;      /* its first token's index in the conversation's token stream
                               * (hist_tokens + its place in tokens[]); read: -1 when the
                               * file does not say (version 1) */
} kvp_snapshot_msg;

typedef struct kvp_snapshot {
    char id[KVP_SNAPSHOT_ID_MAX + 1];
    kvp_snapshot_identity ident;
    int budget;               /* KV rows per head the cache was kept to (0 = unbounded) */
    char tenant[KVP_SNAPSHOT_TENANT_MAX + 1];   /* whose session ("": none; before 4) */
    int turns;
    uint64_t evicted_rows;
    double created, last_active;     /* wall clock, seconds since the Unix epoch */
    char *system;             /* the session's system text (read: NUL-terminated copy or
                                 NULL; may hold NULs: use system_len) */
    size_t system_len;
    /* The bounded history: msgs[0] is the conversation's message hist_msgs, tokens[0] its
     * token hist_tokens; hist_hash is the transcript hash's state after the dropped
     * messages (KVP_FNV1A_INIT when none). The cache holds hist_tokens + n_cached tokens. */
    int hist_msgs;
    int64_t hist_tokens;
    uint64_t hist_hash;
    int version;              /* read: the file's */
    kvp_snapshot_msg *msgs;
    int n_msgs;
    int *tokens;              /* transcript token ids */
    int n_tokens;
    int n_cached;             /* tokens[0..n_cached) are in the cache */
    void *cache;              /* kvp_cache_serialize() output */
    size_t cache_len;
} kvp_snapshot;

/* 1 when id is 1..64 characters of [A-Za-z0-9_-] (safe as a file name), else 0. */
int kvp_snapshot_id_valid(const char *id);

/* FNV-1a 64 of the file's size (u64 little-endian) followed by its first max_bytes
 * bytes. 0 or a negative errno with a message. */
int kvp_snapshot_hash_file(const char *path, uint64_t max_bytes, uint64_t *hash,
                           char *err, size_t errlen);

/* The running daemon's identity: the model's name and file, the policy's name and file
 * (NULL or "" when the policy has none). */
int kvp_snapshot_identity_init(kvp_snapshot_identity *ident, const char *model_name,
                               const char *model_path, const char *policy_name,
                               const char *policy_path, char *err, size_t errlen);
/* 1 when a snapshot made under `a` can be resumed under `b`. */
int kvp_snapshot_identity_equal(const kvp_snapshot_identity *a, const kvp_snapshot_identity *b);

/* Writes <dir>/<snap->id>.snap atomically: <id>.snap.tmp, fsync, rename, removal of the
 * journal it supersedes, fsync of the directory. Only reads *snap (its pointers may borrow a session's arrays). At most
 * one writer per id at a time. 0, or a negative errno with a message; on failure the
 * previous snapshot, if any, is intact. */
int kvp_snapshot_write(const char *dir, const kvp_snapshot *snap, char *err, size_t errlen);

/* The snapshot's bytes as a file holds them (header, sections, checksum), for stores
 * that are not the directory (store/store.h). *out is malloc'd. 0, -EINVAL (as
 * kvp_snapshot_write) or -ENOMEM, with a message. */
int kvp_snapshot_encode(const kvp_snapshot *snap, unsigned char **out, size_t *len,
                        char *err, size_t errlen);
/* Validates bytes made by kvp_snapshot_encode (or read from a file) for session id into
 * *out, taking buf (freed on failure, kept as out->cache on success). 0, -EINVAL (bad id),
 * -EBADMSG (damaged: err says why) or -ENOMEM. */
int kvp_snapshot_decode(unsigned char *buf, size_t len, const char *id, kvp_snapshot *out,
                        char *err, size_t errlen);

/* Reads and validates <dir>/<id>.snap into *out (free with kvp_snapshot_free).
 *   -EINVAL   id is not valid (nothing touched)
 *   -ENOENT   no snapshot
 *   -EBADMSG  truncated, corrupted, wrong magic/version or inconsistent: the file was
 *             renamed to <id>.snap.bad-<unix time> and the message says so
 *   other     I/O errors (the file is left in place)
 * The cache blob is covered by the checksum; decode it with kvp_cache_deserialize (a
 * failure there, e.g. after a cache format change, means: rebuild from the transcript). */
int kvp_snapshot_read(const char *dir, const char *id, kvp_snapshot *out,
                      char *err, size_t errlen);
void kvp_snapshot_free(kvp_snapshot *snap);

/* The journal, <dir>/<id>.journal: one record per turn appended after a full snapshot,
 * so a turn writes what it added (messages, tokens) and the cache, not the whole
 * conversation; a full snapshot (kvp_snapshot_write) replaces it. */
typedef struct kvp_journal_rec {
    int turns;
    uint64_t evicted_rows;
    double last_active;
    int msgs_before;                 /* the transcript this record extends (message and */
    const kvp_snapshot_msg *msgs;    /* token counts of the whole conversation, dropped */
    int n_msgs;                      /* history included) */
    int64_t tokens_before;
    const int *tokens;
    int n_tokens;
    int n_cached;                    /* of the stored tokens after the record */
    int hist_msgs;                   /* the bounded history after the record (as in */
    int64_t hist_tokens;             /* kvp_snapshot): the replay drops up to there */
    uint64_t hist_hash;
    const void *cache;               /* kvp_cache_serialize() output: the cache now */
    size_t cache_len;
} kvp_journal_rec;

/* Appends a record (the file and its header are created first if absent) and fsyncs;
 * *size: the journal's bytes after. 0 or a negative errno with a message; a failed
 * append may leave a torn record, which replay ignores (write a full snapshot next). */
int kvp_journal_append(const char *dir, const char *id, const kvp_journal_rec *rec,
                       size_t *size, char *err, size_t errlen);
/* Applies <dir>/<id>.journal to a snapshot just read: each record that extends it (by its
 * message and token counts) in order; records the snapshot already holds are skipped.
 * *size: the journal's bytes. 0: none, or all of it applied; 1: a damaged, torn or
 * unrelated tail was ignored (err says so; the next write must be a full snapshot). */
int kvp_journal_replay(const char *dir, const char *id, kvp_snapshot *snap, size_t *size,
                       char *err, size_t errlen);

/* 1 when <dir>/<id>.snap exists, 0 otherwise (also for an invalid id). */
int kvp_snapshot_exists(const char *dir, const char *id);
/* Removes <dir>/<id>.snap, its journal and any <id>.snap.tmp; 0 also when there was none. */
int kvp_snapshot_remove(const char *dir, const char *id, char *err, size_t errlen);
/* Deletes every *.snap.tmp left by a crash (call at start, before any write). Returns
 * how many were removed, or a negative errno with a message. */
int kvp_snapshot_clean(const char *dir, char *err, size_t errlen);

#endif
