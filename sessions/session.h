/* Conversations: transcript (text and token ids), KV cache, eviction policy and the
 * state of the job in flight (a turn, or loading or saving the session's snapshot).
 *
 * Ownership: the loop thread owns every session. While a job runs (busy), the worker
 * that holds it in the scheduler owns the model-side fields (cache, policy, sampler,
 * tokens, transcript, turn); the loop reads only the fields marked "loop". The hand-off
 * both ways goes through the scheduler's mutex-protected queues.
 *
 * Residency: a session is resident (its cache and transcript in memory) or parked (only
 * the loop fields remain; the rest is in its snapshot, sessions/persist.h). Parking is
 * done by the loop on an idle session whose snapshot is up to date; the next job
 * restores it on a worker first. */
#ifndef KVP_SESSION_H
#define KVP_SESSION_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/generate.h"
#include "model/sampler.h"
#include "sessions/snapshot.h"
#include "sessions/template.h"
#include "sessions/utf8.h"

#define KVP_SESSION_ID_LEN 32
#define KVP_SESSION_PATH_MAX 512

/* Shared, read-only while workers run. */
typedef struct kvp_session_env {
    const kvp_model *model;
    kvp_template tpl;
    int chunk;
    int reuse_cache;
    float top_p;
    uint64_t seed;
    const char *state_dir;           /* "" = no snapshots (and no parking) */
} kvp_session_env;

/* An eviction policy as configured: immutable once made, so a reload makes a new one
 * and sessions keep the one they hold. Reference counts are touched on the loop only. */
typedef struct kvp_policy_conf {
    int refs;
    char name[32];
    char file[KVP_SESSION_PATH_MAX];  /* "" = the policy has no file */
    kvp_snapshot_identity ident;      /* the model and this policy, for snapshots */
} kvp_policy_conf;

kvp_policy_conf *kvp_policy_conf_ref(kvp_policy_conf *pc);
void kvp_policy_conf_unref(kvp_policy_conf *pc);

typedef struct kvp_turn_stats {
    int prompt_tokens;       /* new tokens of this turn (template + message + leftovers),
                              * the whole transcript after a rebuild */
    int prefilled_tokens;    /* tokens run through the model in prefill this turn */
    int generated_tokens;
    int transcript_tokens;   /* whole conversation so far */
    int cache_rows_max;      /* largest head, peak over the turn's units */
    int cache_rows;          /* largest head after the turn-boundary eviction */
    size_t cache_bytes;
    size_t cache_bytes_max;  /* peak over the turn's units (memory accounting) */
    uint64_t evicted_rows;   /* this turn */
    uint64_t evicted_total;  /* the session's lifetime */
    double ttft_ms, duration_ms, tokens_per_s;
    const char *stop;        /* "eos", "length", "cancel" */
} kvp_turn_stats;

enum kvp_turn_state { KVP_TURN_START = 0, KVP_TURN_PREFILL, KVP_TURN_DECODE };

typedef struct kvp_turn {
    char *text;              /* the user message */
    size_t text_len;
    int max_tokens;
    float temperature;
    int budget;              /* KV rows per head for this turn (0 = unbounded) */
    atomic_int cancel;       /* set by the loop, read by the worker each unit */
    enum kvp_turn_state state;
    int undo_tokens;         /* transcript length before this turn's message */
    int next_token;          /* sampled, emitted, not yet run through the model */
    kvp_utf8 utf8;
    char *reply;
    size_t reply_len, reply_cap;
    uint64_t evicted_at_start;
    double t_start, t_first;
    kvp_turn_stats stats;
} kvp_turn;

typedef struct kvp_message {
    int user;                /* 1 user, 0 assistant */
    char *text;              /* valid UTF-8, NUL-terminated, but may hold NULs: use len */
    size_t len;
} kvp_message;

enum kvp_job { KVP_JOB_TURN = 0, KVP_JOB_LOAD, KVP_JOB_SAVE };

/* What a restore found, for the loop to apply and log once the job has ended. */
typedef struct kvp_restored {
    int pending;                     /* set by the worker, cleared by the loop */
    int rebuilt;                     /* the cache was not usable: rebuilt from the transcript */
    char note[192];                  /* why it was rebuilt */
} kvp_restored;

typedef struct kvp_session {
    char id[KVP_SESSION_ID_LEN + 1];
    /* loop */
    int busy;
    int parked;                      /* model-side state freed; it is in the snapshot */
    int loading;                     /* a LOAD job runs for a hello */
    int placeholder;                 /* made for a hello naming a session not in memory */
    int save_failed;                 /* its last snapshot write failed: not on disk */
    int turns;
    double created, last_active;     /* seconds, monotonic */
    void *conn;                      /* the websocket attached, if any */
    int rows_max;
    size_t bytes;                    /* cache bytes while idle (0 when parked) */
    size_t reserve;                  /* bytes held for the job in flight (memory cap) */
    uint64_t evicted_rows;
    kvp_policy_conf *pconf;          /* its policy (a reference; workers only read it) */
    struct kvp_session *next;        /* table chain */
    /* model side (the loop may read them while the session is not busy) */
    enum kvp_job job;
    int need_restore;                /* the job reads the snapshot first */
    int has_snapshot;                /* a snapshot of this session exists */
    int saved;                       /* the snapshot matches memory */
    int save_rc;                     /* last job: 1 written, 0 none, < 0 failed (save_err) */
    int lost;                        /* the snapshot is gone or was bad: session lost */
    char save_err[256];
    int turns_done;                  /* completed turns, as the snapshot counts them */
    double created_wall;             /* seconds since the epoch */
    kvp_restored restored;
    kvp_cache cache;
    kvp_policy *policy;              /* made on the first turn's worker */
    uint64_t seed;
    kvp_sampler sampler;
    int *tokens;                     /* transcript token ids */
    int n_tokens, cap_tokens;
    int n_cached;                    /* tokens[0..n_cached) have been run */
    int reply_open;
    kvp_message *msgs;
    int n_msgs, cap_msgs;
    kvp_turn turn;
    struct kvp_session *rq_next;     /* scheduler run queue */
} kvp_session;

typedef struct kvp_session_table {
    kvp_session *head;
    int count;                       /* resident and parked */
    int resident;                    /* what max_sessions limits */
    int max;
    uint64_t created_total;
} kvp_session_table;

/* Creates a resident session and adds it to the table: a fresh random id when id is
 * NULL, else that id (the caller checked it is not in the table). The session holds a
 * reference to pc. The caller enforces the limits. 0 or a negative code with a message. */
int kvp_session_create(kvp_session_table *t, const kvp_session_env *env, kvp_policy_conf *pc,
                       const char *id, double now, kvp_session **out, char *err, size_t errlen);
kvp_session *kvp_session_find(const kvp_session_table *t, const char *id);
/* Unlinks and frees a session that is not busy. */
void kvp_session_remove(kvp_session_table *t, kvp_session *s);
void kvp_session_table_clear(kvp_session_table *t);

/* Loop, on an idle resident session: frees its cache, transcript, policy and sampler.
 * Only when its snapshot is up to date (or it has nothing to keep). */
int kvp_session_parkable(const kvp_session *s);
void kvp_session_park(kvp_session_table *t, kvp_session *s);
/* Loop, on a parked session about to get a job: counts it resident again; the job
 * restores its snapshot on the worker first. 0 or -ENOMEM. */
int kvp_session_unpark(kvp_session_table *t, kvp_session *s, const kvp_session_env *env);

/* Arms a turn for the scheduler (loop thread; the session must not be busy). Takes a
 * copy of the text. */
int kvp_session_begin_turn(kvp_session *s, const char *text, size_t len, int max_tokens,
                           float temperature, int budget, double now);
/* Arms a LOAD or SAVE job (loop thread; not busy). */
void kvp_session_begin_job(kvp_session *s, enum kvp_job job);

/* What a worker reports from one unit of a turn. */
typedef struct kvp_turn_sink {
    void (*token)(void *ctx, kvp_session *s, const char *text, size_t len);
    void (*done)(void *ctx, kvp_session *s, const kvp_turn_stats *st, const char *reply,
                 size_t len);
    void (*error)(void *ctx, kvp_session *s, int code, const char *msg);
    /* A LOAD or SAVE job ended: 0 or a negative code with a message. */
    void (*job)(void *ctx, kvp_session *s, int code, const char *msg);
    void *ctx;
} kvp_turn_sink;

/* Advances the session's job by one unit (a snapshot load or save, a prefill chunk or
 * one decoded token) on a worker's runstate. Returns 1 when more work remains, 0 when
 * the job ended (done, error or job was reported: the worker's last touch). With a
 * state directory, a turn's end (done or error) writes the snapshot first. */
int kvp_turn_step(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs,
                  const kvp_turn_sink *sink);

double kvp_now(void);

#endif
