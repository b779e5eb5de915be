/* Background work: what the daemon does with spare compute, after a turn and never
 * inside a step — the canary's full-cache reference (observe/canary.h) and the
 * transcripts kept for learning (observe/learnlog.h).
 *
 * The loop queues items (kvp_background_canary, kvp_background_transcript): at most
 * KVP_BACKGROUND_MAX canaries and KVP_BACKGROUND_MAX_TRANSCRIPTS conversations'
 * transcripts wait (a new one past that is dropped and counted; a conversation's newer
 * transcript replaces its waiting one). A canary record holds at most 256 x dim floats
 * beyond its tokens, so the waiting canaries hold at most 16 MB per 1024 of the
 * model's width (about 14 MB for a 896-wide model, 64 MB for a 4096-wide one). The scheduler
 * runs them one at a time on a worker (kvpd_sched_set_idle) only when it has nothing
 * else to do: no turn queued, no step running, no job in flight; and while one runs, no
 * step starts (a turn queued meanwhile waits for at most one chunk of the canary).
 * The skip rule: a canary asks before each chunk of its reference run whether any turn
 * is queued or any step or job is running, and if so it is dropped (counted as skipped
 * busy, never resumed): a busy daemon runs no canaries. A transcript write is not
 * skipped; it waits in the queue for an idle moment.
 * Results go to the metrics on the loop (kvp_background_drain). */
#ifndef KVP_BACKGROUND_H
#define KVP_BACKGROUND_H

#include <stdint.h>

#include "observe/canary.h"
#include "observe/learnlog.h"

struct kvp_template;
#include "observe/metrics.h"

#define KVP_BACKGROUND_MAX 16
#define KVP_BACKGROUND_MAX_TRANSCRIPTS 1024

typedef struct kvp_background kvp_background;

/* model, kv_type and chunk: the reference runs' (the sessions'); log: the learn_dir
 * settings (copied; dir "" for none). NULL when out of memory. */
kvp_background *kvp_background_new(const kvp_model *model, kvp_kv_type kv_type, int chunk,
                                   const kvp_learnlog_cfg *log, uint64_t seed);
void kvp_background_free(kvp_background *b);
/* Loop: whether this turn is one of the canary's sampled share (rate in [0, 1]). */
int kvp_background_sample(kvp_background *b, double rate);
/* Loop: a finished record (ownership taken; freed when it cannot be used). */
void kvp_background_canary(kvp_background *b, kvp_canary_rec *r);
/* A conversation to keep in learn_dir (everything is copied). */
typedef struct kvp_background_conv {
    const char *tenant;              /* "" or NULL: the tenant of a daemon without keys */
    const char *session_id;
    const int *tokens;
    int n;
    const char *system;              /* the system prompt (len 0: none) */
    size_t system_len;
    const char *first;               /* the conversation's first message, as rendered */
    size_t first_len;
    int first_user;                  /* its role (kvp_chat_msg.user) */
} kvp_background_conv;

/* Loop: the conversation's tokens, to be written to its tenant's folder of learn_dir;
 * with exclude_system, without its system prompt's tokens (found on the worker by
 * rendering the first message with and without it, tpl's rendering; a conversation
 * whose span is not found is not written). */
void kvp_background_transcript(kvp_background *b, const kvp_background_conv *conv);
/* The template the sessions render with (kept; NULL: exclude_system keeps nothing). */
void kvp_background_set_template(kvp_background *b, const struct kvp_template *tpl);
/* Loop: deletes the tenant's transcripts, those kept and those waiting, and one being
 * written now once it is (kvp_learnlog_forget's returns; -EOPNOTSUPP without learn_dir). */
int kvp_background_forget(kvp_background *b, const char *tenant, int *deleted, char *err,
                          size_t errlen);
const kvp_learnlog_cfg *kvp_background_learnlog(const kvp_background *b);
/* The scheduler's side (any thread): whether an item waits; run the oldest, asking
 * busy(ctx) before each chunk. */
int kvp_background_pending(void *b);
void kvp_background_run(void *b, int (*busy)(void *), void *ctx);
/* Loop: results since the last call into m (histograms per policy and budget, the
 * recent means, counters). */
void kvp_background_drain(kvp_background *b, kvpd_metrics *m);

#endif
