/* Transcripts kept for learning (learn_dir): the token ids of a sampled share of
 * conversations, one file per conversation, for `kvp learn --transcripts DIR`.
 *
 * Privacy: a file holds the token ids of the whole conversation, the system prompt
 * included unless exclude_system is set. The vocabulary is the model's own and public,
 * so the ids ARE the text: anyone who can read a file can decode the conversation. A
 * file holds no session id, no tenant and no time but the file's own; its name is a hash
 * of the session id (which is a credential to resume the session, so it is never
 * written). Files are 0600 in 0700 directories.
 * Layout: one folder per tenant, dir/<tenant>/<hash>.kvtx, the tenant being the API
 * key's id (16 hex digits) or "default" without keys, so a tenant's transcripts can be
 * deleted on their own (kvp_learnlog_forget). Files directly in dir (the layout before
 * the folders) are still read and capped.
 * Retention: after each write, files older than max_age_s are deleted, then the oldest
 * until the files of dir and its tenant folders total at most max_bytes.
 *
 * The file format is base/tokfile.h's (read with kvp_tokfile_read). Written to a
 * temporary name and renamed, so a reader sees an old file or a whole new one. */
#ifndef KVP_LEARNLOG_H
#define KVP_LEARNLOG_H

#include <stddef.h>
#include <stdint.h>

#include "base/tokfile.h"

#define KVP_LEARNLOG_EXT KVP_TOKFILE_EXT

/* The folder of the tenant "" (a daemon without API keys). */
#define KVP_LEARNLOG_DEFAULT_TENANT "default"

typedef struct kvp_learnlog_cfg {
    const char *dir;           /* "" or NULL: off */
    double rate;               /* share of conversations kept, [0, 1] */
    uint64_t max_bytes;        /* the directory's files at most (0: no cap) */
    double max_age_s;          /* files older than this are deleted (0: kept) */
    uint64_t fingerprint;      /* the model's (kvp_model_config.fingerprint) */
    int exclude_system;        /* the system prompt's tokens are left out of the files */
} kvp_learnlog_cfg;

/* Whether the conversation with this session id is one of the sampled share: the same
 * answer on every turn of it. */
int kvp_learnlog_sampled(const kvp_learnlog_cfg *c, const char *session_id);
/* The tenant's folder, dir/<tenant> (dir/default for ""), into out. 0, or -EINVAL for a
 * tenant name other than 1 to 64 of 0-9 a-z (never a path). */
int kvp_learnlog_tenant_dir(const kvp_learnlog_cfg *c, const char *tenant, char *out, size_t n);
/* Writes (replaces) the conversation's file in its tenant's folder and applies the caps.
 * 0, or a negative errno with a message. */
int kvp_learnlog_write(const kvp_learnlog_cfg *c, const char *tenant, const char *session_id,
                       const int *tokens, int n, char *err, size_t errlen);
/* Deletes the tenant's folder with its transcripts (and any temporary file left in it);
 * how many transcripts went in *deleted. 0; -ENOENT when the tenant has no folder;
 * -EINVAL for a bad tenant name; another negative errno when a file could not go (the
 * message names it). */
int kvp_learnlog_forget(const kvp_learnlog_cfg *c, const char *tenant, int *deleted, char *err,
                        size_t errlen);
/* Leaves the system prompt's tokens out of a transcript, in place. with[0..n_with) is the
 * conversation's first message rendered after the system prompt, without[0..n_without)
 * the same message rendered with none: the tokens both share at the start (p) and at the
 * end (q) are the template's, the ones between in `with` the system prompt's. The
 * transcript must begin with with[0..n_with - q). The new count (n when both renderings
 * are the same: the template does not render a system prompt), or -ENOENT when the span
 * is not found there (the transcript begins otherwise): then nothing of the transcript
 * may be kept. */
int kvp_learnlog_strip_system(int *tokens, int n, const int *with, int n_with,
                              const int *without, int n_without);

#endif
