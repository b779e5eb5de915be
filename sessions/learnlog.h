/* Transcripts kept for learning (learn_dir): the token ids of a sampled share of
 * conversations, one file per conversation, for `kvp learn --transcripts DIR`.
 *
 * Privacy: a file holds token ids only (no text, no session id, no tenant, no time but
 * the file's own); its name is a hash of the session id (which is a credential to resume
 * the session, so it is never written). Files are 0600 in a 0700 directory.
 * Retention: after each write, files older than max_age_s are deleted, then the oldest
 * until the directory's files total at most max_bytes.
 *
 * The file format is base/tokfile.h's (read with kvp_tokfile_read). Written to a
 * temporary name and renamed, so a reader sees an old file or a whole new one. */
#ifndef KVP_LEARNLOG_H
#define KVP_LEARNLOG_H

#include <stddef.h>
#include <stdint.h>

#include "base/tokfile.h"

#define KVP_LEARNLOG_EXT KVP_TOKFILE_EXT

typedef struct kvp_learnlog_cfg {
    const char *dir;           /* "" or NULL: off */
    double rate;               /* share of conversations kept, [0, 1] */
    uint64_t max_bytes;        /* the directory's files at most (0: no cap) */
    double max_age_s;          /* files older than this are deleted (0: kept) */
    uint64_t fingerprint;      /* the model's (kvp_model_config.fingerprint) */
} kvp_learnlog_cfg;

/* Whether the conversation with this session id is one of the sampled share: the same
 * answer on every turn of it. */
int kvp_learnlog_sampled(const kvp_learnlog_cfg *c, const char *session_id);
/* Writes (replaces) the conversation's file and applies the caps. 0, or a negative
 * errno with a message. */
int kvp_learnlog_write(const kvp_learnlog_cfg *c, const char *session_id, const int *tokens,
                       int n, char *err, size_t errlen);

#endif
