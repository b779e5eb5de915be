/* Conversations: transcript (text and token ids), KV cache, eviction policy and the
 * state of the turn in flight.
 *
 * Ownership: the loop thread owns every session. While a turn runs (busy), the worker
 * that holds it in the scheduler owns the model-side fields (cache, policy, sampler,
 * tokens, transcript, turn); the loop reads only the fields marked "loop". The hand-off
 * both ways goes through the scheduler's mutex-protected queues. */
#ifndef KVP_SESSION_H
#define KVP_SESSION_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "cache/kvcache.h"
#include "model/forward.h"
#include "model/generate.h"
#include "model/sampler.h"
#include "sessions/template.h"
#include "sessions/utf8.h"

#define KVP_SESSION_ID_LEN 32

/* Shared, read-only while workers run. */
typedef struct kvp_session_env {
    const kvp_model *model;
    kvp_template tpl;
    const char *policy_name;
    const char *policy_file;
    int budget, chunk;
    int reuse_cache;
    float top_p;
    uint64_t seed;
} kvp_session_env;

typedef struct kvp_turn_stats {
    int prompt_tokens;       /* new tokens of this turn (template + message + leftovers) */
    int prefilled_tokens;    /* tokens run through the model in prefill this turn */
    int generated_tokens;
    int transcript_tokens;   /* whole conversation so far */
    int cache_rows_max;      /* largest head, peak over the turn's units */
    int cache_rows;          /* largest head after the turn-boundary eviction */
    size_t cache_bytes;
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
    char *text;
} kvp_message;

typedef struct kvp_session {
    char id[KVP_SESSION_ID_LEN + 1];
    /* loop */
    int busy;
    int turns;
    double created, last_active;     /* seconds, monotonic */
    void *conn;                      /* the websocket attached, if any */
    int rows_max;
    size_t bytes;
    uint64_t evicted_rows;
    struct kvp_session *next;        /* table chain */
    /* model side */
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
    int count, max;
    uint64_t created_total;
} kvp_session_table;

/* Creates a session with a fresh random id and adds it to the table. -ENOSPC when the
 * table is full; other negative codes with a message. */
int kvp_session_create(kvp_session_table *t, const kvp_session_env *env, double now,
                       kvp_session **out, char *err, size_t errlen);
kvp_session *kvp_session_find(const kvp_session_table *t, const char *id);
/* Unlinks and frees a session that is not busy. */
void kvp_session_remove(kvp_session_table *t, kvp_session *s);
void kvp_session_table_clear(kvp_session_table *t);

/* Arms a turn for the scheduler (loop thread; the session must not be busy). Takes a
 * copy of the text. */
int kvp_session_begin_turn(kvp_session *s, const char *text, size_t len, int max_tokens,
                           float temperature, double now);

/* What a worker reports from one unit of a turn. */
typedef struct kvp_turn_sink {
    void (*token)(void *ctx, kvp_session *s, const char *text, size_t len);
    void (*done)(void *ctx, kvp_session *s, const kvp_turn_stats *st, const char *reply,
                 size_t len);
    void (*error)(void *ctx, kvp_session *s, int code, const char *msg);
    void *ctx;
} kvp_turn_sink;

/* Advances the session's turn by one unit (a prefill chunk or one decoded token) on
 * a worker's runstate. Returns 1 when more work remains, 0 when the turn ended (done
 * or error was reported). */
int kvp_turn_step(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs,
                  const kvp_turn_sink *sink);

double kvp_now(void);

#endif
