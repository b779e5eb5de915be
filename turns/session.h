/* Conversations on the worker side (turns/; the hub, sessions/, above, drives them and
 * front ends use sessions/hub.h only): transcript (text and token ids), KV cache,
 * eviction policy, the session's state and the turn state machine.
 *
 * State (one enum): IDLE (resident, no job), TURN / LOAD / SAVE (a job in flight on a
 * worker: a turn, reading the snapshot for an open, writing it at shutdown), PARKED
 * (only the loop fields remain; the rest is in its snapshot, turns/persist.h).
 *   IDLE -> TURN, SAVE -> IDLE;  PARKED -> LOAD or TURN (restored first) -> IDLE;
 *   IDLE -> PARKED (the loop, when the snapshot is up to date).
 * The persistence facts beside it (has_snapshot, saved, need_restore, res.lost) say
 * what is on disk, not what the session is doing.
 *
 * Ownership, said at each struct: kvp_session_env and kvp_policy_conf are read-only
 * while workers run; kvp_turn_request (s->rq) is the loop's, which the worker only
 * reads: the turn's request as a value (its kvp_turn_spec, the options the loop arms a
 * turn with; the worker writes into the logprob and canary buffers the spec points to,
 * never the spec's fields), the history and rendering it continues from, and the cancel
 * flag, an atomic only the loop sets; kvp_turn (s->turn) is the worker's, the turn as it runs,
 * which the loop does not read; kvp_job_result (s->res) is the worker's, which the loop
 * only reads after the job's final event. A turn's outcome reaches the loop in its
 * events (the reply and stats with its done) and in s->res. The rest of a session is
 * handed off whole: the loop owns it, and from kvpd_sched_submit until the loop has
 * taken the job's final event (busy: TURN, LOAD, SAVE, RENDER) the worker that holds it
 * owns everything but the fields marked "loop" and s->rq — so after a submit the loop
 * looks at the state it set itself before anything else, and at no other field while
 * the session is busy. The persistence fields: the last job's outcome (the snapshot
 * write, the restore, lost, elsewhere) is in s->res; need_restore, save_failed and the
 * retries are the loop's (the worker reads need_restore, and reports in s->res instead
 * of clearing it); the disk facts (has_snapshot, saved, turns_done, store_version, the
 * journal's) are written by the worker, the loop only setting a new session's before its
 * first job (a fork's turns_done and journal_ok). Still written by both sides in turn
 * (the loop before or after a job, the worker during it): the model side, which the loop
 * frees when it parks the session (the cache, policy, sampler, transcript and the last
 * turn's buffers) and fills when it makes one (a fork's copy, a seeded transcript). The
 * hand-off both ways goes through the scheduler's mutex-protected run queue and event
 * queue, which order each side's writes before the other's reads;
 * scripts/test.sh --tsan checks it. */
#ifndef KVP_SESSION_H
#define KVP_SESSION_H

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "base/clock.h"
#include "cache/kvcache.h"
#include "turns/types.h"
#include "model/forward.h"
#include "generate/generate.h"
#include "model/sampler.h"
#include "store/snapshot.h"
#include "model/template.h"
#include "base/utf8.h"

#define KVP_SESSION_PATH_MAX 512

/* Owner: the loop, before the workers start (trie: once, on the loop, before the first
 * constrained turn is queued); read-only on every thread while they run. */
typedef struct kvp_session_env {
    const kvp_model *model;
    kvp_template tpl;
    kvp_template tpl_raw;            /* the plain format on the same vocabulary: raw text
                                      * completions on a model with a chat template */
    int chunk;
    kvp_kv_type kv_type;             /* how every session's cache rows are stored */
    int budget_mode;                 /* enum kvp_budget_mode: the budget per head or shared */
    int step_tokens;                 /* rows of a batched step (at least chunk) */
    int prefill_tokens;              /* rows of a step's prefill slice at most (at least
                                      * chunk; 0: the rows the decodes leave) */
    int reuse_cache;
    int share_rows;                  /* forks share their rows (kvp_session_fork) */
    int share_prompts;               /* a prompt takes the rows of its prefix another turn
                                      * of its step holds (sessions/step_plan.c) */
    float top_p;
    uint64_t seed;
    struct kvp_store *store;         /* NULL = no snapshots (and no parking) */
    const char *state_dir;           /* the directory store's ("" otherwise): the
                                      * transcript index lives there */
    const struct kvp_vocab_trie *trie;   /* the vocabulary's byte trie for constrained
                                          * replies, made with the first (NULL until) */
} kvp_session_env;

/* An eviction policy as configured: immutable once made, so a reload makes a new one
 * and sessions keep the one they hold. Reference counts are touched on the loop only.
 * weights: the policy file loaded once when the conf was made (the daemon's one copy,
 * read by every session's policy instance; freed with the conf, which every session
 * holding an instance references); NULL: each session loads `file` itself. */
struct kvp_policy_weights;
typedef struct kvp_policy_conf {
    int refs;
    char name[32];
    char file[KVP_SESSION_PATH_MAX];  /* "" = the policy has no file */
    kvp_snapshot_identity ident;      /* the model and this policy, for snapshots */
    struct kvp_policy_weights *weights;
} kvp_policy_conf;

kvp_policy_conf *kvp_policy_conf_ref(kvp_policy_conf *pc);
void kvp_policy_conf_unref(kvp_policy_conf *pc);

enum kvp_turn_state { KVP_TURN_START = 0, KVP_TURN_PREFILL, KVP_TURN_DECODE };

/* A turn's request as the loop armed it (kvp_session_begin_turn and the kvp_session_turn_*
 * setters, then the hub's options): a value inside kvp_turn_request (s->rq.spec).
 * Owner: the loop, which alone writes it, while the session is not busy; the worker only
 * reads it. The loop allocates its buffers and frees them when it arms the next turn, parks
 * the session or frees it; the message's text goes earlier,
 * with the request's release after the turn's final event (the transcript has its copy).
 * The logprob buffers (lp, lp_row, lp_ends) and the canary's record are the exception to
 * "only reads": the loop makes them so the step allocates nothing, the worker writes
 * their contents (never these pointers) while the turn runs, and the loop reads them
 * after its events. */
typedef struct kvp_turn_spec {
    uint64_t serial;         /* numbers the turns armed on the session (kvp_turn_armed) */
    double t_start;          /* when the turn was asked for (seconds, monotonic) */
    char *text;              /* the user message */
    size_t text_len;
    int max_tokens;
    float temperature;
    float top_p;             /* < 0: the daemon's */
    int has_seed;            /* reseed the sampler with seed at the start */
    uint64_t seed;
    kvp_sample_opts sampling;   /* the sampler's other settings; bias: an owned copy */
    int budget;              /* KV rows per head for this turn (0 = unbounded) */
    int max_history;         /* transcript tokens kept at its end (0 = all) */
    int max_prompt;          /* tokens this turn may prefill (0 = no cap) */
    char *stop[KVP_HUB_MAX_STOPS + 1];   /* stop strings (copies); the last may be an
                                          * end_after string (kept in the reply) */
    size_t stop_len[KVP_HUB_MAX_STOPS + 1];
    int stop_keep[KVP_HUB_MAX_STOPS + 1];
    int n_stop;
    size_t stop_hold;        /* longest stop string - 1: reply bytes held back from the sink */
    int role;                /* of the message: 1 user, KVP_MESSAGE_TOOL tool results */
    char *tools;             /* the request's tools (JSON array) for the template, or NULL */
    size_t tools_len;
    char *prefix;            /* the reply's opening, prefilled, not sampled (or NULL) */
    size_t prefix_len;
    int prefill;             /* the prefix is the client's unfinished assistant message
                              * (kvp_turn_opts.prefill): rendered by the template, never
                              * sent back, not looked through for stop strings */
    /* the grammar the turn's start binds the reply's matcher to (a reference; NULL:
     * unconstrained) and whether max_tokens was the request's own (the refusal's text
     * names the request's limit, not the daemon's ceiling) */
    struct kvp_grammar *gsrc;
    int gasked;
    /* The eviction canary's record of this turn's distributions (observe/canary.h;
     * NULL: not sampled), written by the worker while the turn runs (unless it drops it:
     * kvp_job_result.canary_dropped); after the turn's done the loop hands it to the
     * background queue, which owns it from then on. */
    struct kvp_canary_rec *canary;
    /* Log-probabilities (kvp_turn_opts.logprobs; lp_on 0: none): per reply token, in
     * lp[i * (1 + lp_k)], its own entry then its lp_k most likely alternatives, for
     * lp_cap tokens (max_tokens); lp_row: the raw logits copied before the draw; lp_ends:
     * each token's end in the reply (the worker's kvp_turn.tok_end while the turn runs). */
    int lp_on, lp_k, lp_cap;
    kvp_hub_logprob *lp;
    float *lp_row;
    size_t *lp_ends;
} kvp_turn_spec;

/* A turn as it runs. Owner: the worker that runs it, which alone writes it: it resets it
 * at the turn's start (kvp_turn_reset: the previous turn's buffers freed), and the loop
 * reads nothing of it (a turn's outcome reaches the loop in its events and in
 * kvp_job_result). Its buffers are freed by the next turn's start on its worker, or by
 * the loop when the session parks or goes (not busy then). Its settings are
 * s->rq.spec's. */
typedef struct kvp_turn {
    uint64_t serial;         /* the spec's serial this turn started from */
    enum kvp_turn_state state;
    int undo_tokens;         /* transcript length before this turn's message */
    int turns_before;        /* the session's completed turns when this one began */
    int cut;                 /* this node's lease ran out: not saved, memory dropped */
    int recorded;            /* this turn's user message is in the transcript */
    int planned;             /* it has been planned into a batched step */
    int passed_over;         /* steps in a row whose prefill slice left its chunk out */
    int reply_from;          /* where the reply's tokens begin in tokens[] */
    int next_token;          /* sampled, emitted, not yet run through the model */
    kvp_evict_cfg evict;     /* the bounds of its unit in the running step */
    kvp_utf8 utf8;
    char *reply;
    size_t reply_len, reply_cap;
    size_t sent;             /* bytes of reply given to the sink as tokens */
    int prefill_at;          /* with the Jinja template: where the prefill's tokens begin */
    int stopped;             /* a stop string was found at stop_at: the reply ends there */
    size_t stop_at;
    int stop_word;           /* which of the spec's stop[] that was */
    int gen_start;           /* transcript index of the reply's first token */
    size_t *tok_end;         /* with stop strings or logprobs, per reply token: the reply's
                              * length after it, SIZE_MAX while a character was incomplete;
                              * with logprobs the spec's lp_ends (tok_end_lent: not freed
                              * here), else grown on the worker */
    int tok_end_cap, tok_end_lent;
    uint64_t evicted_at_start;
    double t_first;
    kvp_turn_stats stats;
    struct kvp_gmatch *gm;   /* the reply's grammar matcher (NULL: unconstrained) */
    uint32_t *gmask;         /* its mask for the next token (vocab bits) */
    int gshaped;             /* the length budget left out a token the grammar allowed: the
                              * reply's stats say shaped however it ends */
    /* Ended with its final event still to send after the snapshot write (end_turn):
     * done (end_code 0) or an error (end_code < 0, end_msg). */
    int end;
    int end_code;
    char end_msg[192];
    /* Log-probabilities (the spec's lp_on): lp_sent: tokens whose entries went out with
     * token events; lp_from..lp_to: those of the event being sent. */
    int lp_sent, lp_from, lp_to;
} kvp_turn;

enum kvp_session_state {
    KVP_SESSION_IDLE = 0,
    KVP_SESSION_TURN,
    KVP_SESSION_LOAD,
    KVP_SESSION_SAVE,
    KVP_SESSION_PARKED,
    /* a new session's request rendered on a worker (its messages into tokens[]) before
     * the loop looks up its fork source (sessions/hub_match.c); never named meanwhile */
    KVP_SESSION_RENDER,
};

/* What a restore found, for the loop to apply and log once the job has ended (part of
 * kvp_job_result: the worker's). */
typedef struct kvp_restored {
    int pending;                     /* this job restored the session */
    int rebuilt;                     /* the cache was not usable: rebuilt from the transcript */
    char note[192];                  /* why it was rebuilt */
    char tenant[KVP_TENANT_LEN + 1]; /* the snapshot's tenant, the session's from then on
                                      * (the loop reads the session's own while it is busy) */
} kvp_restored;

/* A turn request: what the loop hands the worker with a queued turn: the turn's options
 * (spec), the history it continues from instead of msgs (a cut back or a fork's source,
 * turns/rewind.h), that history as a render job rendered it, the turn's message as
 * rendered, where its cache came from, and the cancel flag.
 * Owner: the loop. Written on the loop while the session is not busy (cancel: at any
 * time); the worker only reads it, and takes a buffer over by saying so in
 * kvp_job_result (took_*), never by clearing it. The loop frees what the job left after
 * its final event (kvp_session_request_release), the spec's buffers when it arms the next
 * turn. */
typedef struct kvp_turn_request {
    kvp_turn_spec spec;
    /* set by the loop (atomically, the session busy or not) to stop the running turn;
     * cleared when it arms the next; read by the worker each unit */
    atomic_int cancel;
    /* the history the queued turn continues from instead of msgs; rewind_set: armed */
    kvp_message *rewind_msgs;
    int rewind_n, rewind_set;
    /* the rewind's history as a render job already rendered it (tokens and each message's
     * first token, taken over instead of rendering again; NULL: rendered at the turn's
     * start) */
    int *rewind_tokens, *rewind_msg_tok;
    int rewind_n_tokens;
    /* the next turn's message as the render job rendered it with the family template
     * (the tokens it appends when no Jinja template renders the turn; NULL: rendered at
     * the turn's start) */
    int *turn_ids;
    int n_turn_ids;
    /* where the queued turn's cache came from (enum kvp_reuse_source; a fork from another
     * session sets it, the turn's stats take it) */
    int reuse_from;
    /* a turn was submitted with it: what it took is in s->res until the release */
    int given;
} kvp_turn_request;

/* What a job leaves for the loop besides its events and its turn's stats: what it took
 * of the request, what its restore found and its snapshot write did, whether another
 * node holds the session. Owner: the worker. Reset by the worker at each job's start (kvp_job_result_reset),
 * written only there and by the job; the loop reads it after the job's final event and
 * never writes it. */
typedef struct kvp_job_result {
    int took_rewind;                 /* the request's rewind (its messages and rendering)
                                      * became the transcript: the loop does not free it */
    int took_turn_ids;               /* the request's turn_ids were appended and freed */
    /* the turn's start refused the request itself (a reply of its grammar could not
     * start or be finished): a bad request, not the daemon's error */
    int refused;
    /* with logprobs: the reply's tokens whose entries (the spec's lp) go with its done,
     * those whose text is returned */
    int lp_n;
    /* the canary's record (the spec's) could not take a token: it is not kept */
    int canary_dropped;
    kvp_restored restored;
    /* The session had to be read from the store first (the loop's need_restore, or memory
     * found behind the store's version when the lease was taken) and was not: memory does
     * not hold it. lost: the snapshot is gone or was bad (-ENOENT, -EBADMSG), the session
     * with it. */
    int unrestored;
    int lost;
    /* The turn's snapshot write at its end: 1 written, 0 none, < 0 failed (save_err);
     * save_ms and save_bytes: the last write's time and bytes (kvp_session_save). */
    int save_rc;
    char save_err[256];
    double save_ms;
    size_t save_bytes;
    /* -EADDRINUSE: another node holds the session's lease, for about this many ms more */
    int elsewhere_ms;
} kvp_job_result;

static inline void kvp_job_result_reset(kvp_job_result *r)
{
    r->took_rewind = r->took_turn_ids = 0;
    r->refused = r->lp_n = r->canary_dropped = 0;
    r->restored.pending = r->restored.rebuilt = 0;
    r->restored.note[0] = '\0';
    r->unrestored = r->lost = 0;
    r->save_rc = 0;
    r->save_err[0] = '\0';
    r->save_ms = 0;
    r->save_bytes = 0;
    r->elsewhere_ms = 0;
}

/* A conversation. Owner: the loop, handed off whole to the worker of each job (the
 * header's comment); fields marked "loop" stay the loop's throughout, rq is the loop's
 * and res the worker's. */
typedef struct kvp_session {
    char id[KVP_SESSION_ID_LEN + 1];
    /* loop */
    enum kvp_session_state state;    /* the worker reads it to know its job */
    int turns;
    double created, last_active;     /* seconds, monotonic */
    struct kvp_hub_client *client;   /* the front end attached, if any */
    struct kvp_hub_client *owner;    /* who started the running turn (gets its events) */
    uint64_t creator;                /* serial of the client that started it (0: none) */
    /* The API key's tenant that made it ("": no keys configured); only clients of the
     * same tenant attach to it. Kept in its snapshot. */
    char tenant[KVP_TENANT_LEN + 1];
    int rows_max;
    size_t bytes;                    /* cache bytes while idle (0 when parked): its own rows
                                      * and the shared blocks charged to it */
    size_t shared_bytes;             /* of bytes, the shared blocks (kvp_cache_shared_bytes) */
    size_t borrowed_bytes;           /* every shared block its cache reads, charged to it
                                      * or to another (kvp_cache_borrowed_bytes) */
    int shares;                      /* its cache reads a shared block (borrowed_bytes > 0) */
    size_t reserve;                  /* cache bytes held for the job in flight (memory cap) */
    size_t reserve_lp;               /* and its turn's logprob buffers' bytes */
    uint64_t evicted_rows;
    kvp_policy_conf *pconf;          /* its policy (a reference; workers only read it) */
    struct kvp_session *next, *prev; /* the table's list, oldest first */
    struct kvp_session *rnext, *rprev;   /* the resident list */
    struct kvp_session *hnext;       /* id hash chain */
    /* loop, never written while busy: the next job reads the snapshot first (set when
     * unparked or made to be read, cleared when a job read it back: res.restored.pending,
     * set when one had to and could not: res.unrestored); the worker reads it */
    int need_restore;
    /* loop: its last snapshot write failed, not on disk; the writes retried since the
     * last that succeeded; when the next retry may start (kvp_now) */
    int save_failed;
    int save_retries;
    double save_retry_at;
    /* The disk facts: written by the worker of each job (the store's reads and writes,
     * a cut turn), read by the loop while the session is not busy; the loop writes only
     * a new session's before its first job (a fork's turns_done and journal_ok). */
    int has_snapshot;                /* a snapshot of this session exists */
    int saved;                       /* the snapshot matches memory */
    int save_leased;                 /* worker: the save being made is a turn's own: it needs
                                      * the turn's lease still live (kvp_store_put_leased) */
    int turns_done;                  /* completed turns, as the snapshot counts them */
    /* The stored version memory descends from (its last read or write; 0: none): a
     * shared store holding another version was written by another node since. */
    uint64_t store_version;
    /* What is on disk: the snapshot plus its journal hold the conversation's first
     * journal_msgs messages and journal_tokens tokens (dropped history included);
     * journal_ok: the next save may append to the journal. */
    int journal_ok, journal_msgs;
    int64_t journal_tokens;
    size_t journal_bytes, base_bytes;  /* the journal's size; the last full snapshot's */
    double created_wall;             /* seconds since the epoch */
    kvp_job_result res;              /* worker -> loop, the worker's (above) */
    /* model side (the loop may read them while the session is not busy; written by both
     * in turn: the header's comment) */
    kvp_cache cache;
    kvp_policy *policy;              /* made on the first turn's worker */
    uint64_t seed;
    kvp_sampler sampler;
    int *tokens;                     /* transcript token ids */
    int n_tokens, cap_tokens;
    int n_cached;                    /* tokens[0..n_cached) have been run */
    int reply_open;
    int jinja_rendered;              /* tokens[] were built by the model's Jinja template turn
                                        by turn (kvp_template_jinja_turn), replies as
                                        generated; 0 after the family rebuilt them */
    /* The system text the chat template renders at the conversation's start (NULL/0:
     * none, the template's default if it has one). Set when the session is made, never
     * changed; persisted with the session. */
    char *system;
    size_t system_len;
    kvp_message *msgs;
    int *msg_tok;                    /* [cap_msgs] where each message's tokens begin in tokens[] */
    int n_msgs, cap_msgs;
    /* The bounded history (max_history_tokens): msgs[0] is the conversation's message
     * hist_msgs and tokens[0] its token hist_tokens; what came before was dropped, its
     * messages summed up in hist_hash (kvp_session_transcript_hash's state after the
     * system text and them; meaningful when hist_msgs > 0).
     * The cache holds the tokens of all of it: cache.n_seen == hist_tokens + n_cached. A
     * rebuilt cache starts a new token stream from the kept messages (hist_tokens 0). */
    int hist_msgs;
    int64_t hist_tokens;
    uint64_t hist_hash;
    /* loop: the hash of system and msgs (kvp_session_transcript_hash) as of the last job's end, and
     * their count, kept while parked: how stateless requests find their conversation */
    uint64_t transcript_hash;
    int transcript_msgs;             /* of the whole conversation, dropped ones included */
    int transcript_dropped;          /* of those, dropped from the stored history */
    kvp_turn turn;
    kvp_turn_request rq;             /* loop -> worker, the loop's (above) */
    /* loop -> worker: a session that keeps nothing (one of a request's other choices,
     * sessions/hub_choices.c; a raw completion, hub_complete.c; a turn with
     * kvp_turn_opts.ephemeral, hub_match.c): no lease, never saved, never in the
     * transcript or prefix index, never a source to continue, cut back or fork, not
     * logged to learn_dir; it ends when its turn ends or its client leaves it */
    int ephemeral;
    /* loop -> worker: a raw text completion on a model with a chat template: its text is
     * tokenized by env->tpl_raw (no template), never by the chat template (kvp_session_tpl);
     * ephemeral too, so no chat request ever continues it */
    int raw;
    /* loop -> worker: a raw completion given as token ids: its message's tokens, taken
     * as they are instead of its text tokenized (malloc'd; NULL: none) */
    int *raw_ids;
    int n_raw_ids;
    /* loop: its first turn's rendered prompt is in the prefix index while the turn runs,
     * so a new conversation sharing a long prefix waits for it (sessions/hub_wait.c);
     * cleared at the job's end */
    int prefix_inflight;
    /* loop: made by a hello's fork (sessions/hub_fork.c) and no turn of its own queued
     * yet: like a session that never ran a turn, it ends when its client leaves it */
    int fork_unrun;
    /* loop: made for an id known only on disk and not read yet, so its tenant is not
     * known: an open or fork of it by any tenant waits for its load, which checks. Set
     * before the load is queued, cleared when the loop takes in what the load read. */
    int unread;
    /* loop: its load job reads it for a hello's fork: the job's end goes to its owner
     * (the forking client; NULL once that one closed), never to its attached client */
    int fork_read;
    /* worker: the TURN's next unit waits on I/O (its end: the snapshot write, then the
     * final event; its start, with the lease, snapshot, policy and transcript, is a job
     * by kvp_turn_armed), so it runs as a job on a worker of its own, never inside a
     * batched step (kvp_session_job_next). */
    int io_next;
    struct kvp_session *rq_next;     /* scheduler run queue */
} kvp_session;

/* The template s's turns are tokenized by: env->tpl_raw for a raw completion, else the
 * model's chat template. */
static inline const kvp_template *kvp_session_tpl(const kvp_session *s,
                                                  const kvp_session_env *env)
{
    return s->raw ? &env->tpl_raw : &env->tpl;
}

/* Every session (by id in O(1)), and the resident ones apart: admission and parking
 * visit only those, however many are parked. */
typedef struct kvp_session_table {
    kvp_session *head, *tail;        /* oldest first */
    kvp_session *resident_head;
    kvp_session **buckets;
    size_t n_buckets;                /* a power of two */
    int count;                       /* resident and parked */
    int resident;                    /* what max_sessions limits */
    uint64_t created_total;
} kvp_session_table;

static inline int kvp_session_busy(const kvp_session *s)
{
    return s->state == KVP_SESSION_TURN || s->state == KVP_SESSION_LOAD ||
           s->state == KVP_SESSION_SAVE || s->state == KVP_SESSION_RENDER;
}

/* Whether a turn is armed (s->rq.spec) whose start has not run yet: its first unit is
 * turn_start, a job. */
static inline int kvp_turn_armed(const kvp_session *s)
{
    return s->turn.serial != s->rq.spec.serial;
}

/* Whether the session's next unit runs alone as a job (LOAD, SAVE, RENDER, a turn's
 * start or end) rather than as a part of a batched step. The scheduler reads it on queued
 * sessions, under its queue's mutex. */
static inline int kvp_session_job_next(const kvp_session *s)
{
    return s->state != KVP_SESSION_TURN || s->io_next || kvp_turn_armed(s);
}

int kvp_session_table_init(kvp_session_table *t);

/* Creates a resident session and adds it to the table: a fresh random id when id is
 * NULL, else that id (the caller checked it is not in the table). The session holds a
 * reference to pc. The caller enforces the limits. 0 or a negative code with a message. */
int kvp_session_create(kvp_session_table *t, const kvp_session_env *env, kvp_policy_conf *pc,
                       const char *id, double now, kvp_session **out, char *err, size_t errlen);
kvp_session *kvp_session_find(const kvp_session_table *t, const char *id);
/* Loop: an armed rewind (turns/rewind.h) whose turn did not start is forgotten. */
void kvp_session_rewind_clear(kvp_session *s);
/* Loop: the pre-rendered message of a turn that did not start is forgotten. */
void kvp_session_turn_ids_clear(kvp_session *s);
/* Loop: an armed rewind its transcript took over (kvp_session_rewind_apply) leaves the
 * request; nothing is freed. */
void kvp_session_rewind_let_go(kvp_session *s);
/* Loop, after a turn's final event (or when the session goes after a turn whose end
 * never came back): the request's buffers the job did not take over (s->res.took_*, read
 * only when a turn was given the request) are freed and the request is empty again. */
void kvp_session_request_release(kvp_session *s);
/* Unlinks and frees a session that is not busy. */
void kvp_session_remove(kvp_session_table *t, kvp_session *s);
void kvp_session_table_clear(kvp_session_table *t);

/* Drops the messages and the token count (not the token buffer): the transcript of a
 * session that was never spoken to. */
void kvp_session_clear_transcript(kvp_session *s);
/* Loop, on an idle resident session: frees its cache, transcript, policy and sampler.
 * Only when its snapshot is up to date (or it has nothing to keep). */
int kvp_session_parkable(const kvp_session *s);
void kvp_session_park(kvp_session_table *t, kvp_session *s);
/* Loop, on a parked session about to get a job: resident (IDLE) again; the job
 * restores its snapshot on the worker first. 0 or -ENOMEM. */
int kvp_session_unpark(kvp_session_table *t, kvp_session *s, const kvp_session_env *env);

/* Arms a turn for the scheduler (loop thread; the session must not be busy): a new
 * s->rq.spec (the last one's buffers freed), cancel cleared. Takes a copy of the text.
 * The setters below and the hub fill in the rest of the spec before the submit. */
int kvp_session_begin_turn(kvp_session *s, const char *text, size_t len, int max_tokens,
                           float temperature, int budget, double now);
/* Loop, after kvp_session_begin_turn: the turn's stop strings (copies; n at most
 * KVP_HUB_MAX_STOPS, each 1..KVP_HUB_STOP_MAX bytes). 0, -EINVAL or -ENOMEM. */
int kvp_session_turn_stops(kvp_session *s, const char *const *stop, const size_t *len, int n);
/* The turn's sampling settings (o's biases copied); -EINVAL as kvp_sample_opts_check. */
int kvp_session_turn_sampling(kvp_session *s, const kvp_sample_opts *o);
/* Loop, after kvp_session_begin_turn: the turn records log-probabilities for each reply
 * token with top alternatives (0..KVP_LOGPROBS_MAX_TOP; more than the vocabulary: all of
 * it); top < 0: none. 0, -EINVAL or -ENOMEM. */
int kvp_session_turn_logprobs(kvp_session *s, int vocab, int top);
/* The bytes kvp_session_turn_logprobs allocates for a turn of max_tokens tokens with
 * `top` alternatives (top < 0: 0), which the memory cap reserves with the turn. */
size_t kvp_session_logprobs_bytes(int max_tokens, int vocab, int top);
/* Sets s->bytes, shared_bytes, borrowed_bytes and shares from its cache (a shared block
 * nobody pays for any more is charged to s: kvp_cache_bytes). Loop, on an idle session,
 * or the worker running its job. */
void kvp_session_count_bytes(kvp_session *s);
/* Worker (or a test's bare session): the reply of the armed turn is one of g's
 * documents, its matcher in s->turn (turns/constrain.c): each token
 * is drawn from those that continue it, a stop token only once it is whole, and only
 * while the document can still be finished in the tokens the turn has left (its
 * max_tokens), so the reply always ends whole; tr (or NULL): the vocabulary's trie, whose
 * one-byte tokens the distances are fitted to. 0, -ENOMEM, -EINVAL when no byte can open
 * one of g's documents, or -E2BIG when its shortest document may take more tokens than
 * max_tokens (*need: how many, at most one per byte). */
int kvp_session_turn_grammar(kvp_session *s, struct kvp_grammar *g,
                             const struct kvp_vocab_trie *tr, int *need);
/* Worker, at the turn's start: the matcher of the turn's grammar (rq.spec.gsrc) bound to
 * env->trie, as kvp_session_turn_grammar; < 0 with the reason to answer in err (-EINVAL
 * and -E2BIG: the request's, a bad_request; -ENOMEM: the daemon's). */
int kvp_session_start_grammar(kvp_session *s, const kvp_session_env *env, char *err,
                              size_t errlen);
/* Whether a constrained reply can be written with the vocabulary trie tr (one with text
 * tokens and at least one stop token): 0, or -EINVAL with the reason in err. */
int kvp_session_grammar_usable(const struct kvp_vocab_trie *tr, char *err, size_t errlen);
/* Whether the armed turn's reply is a whole document of its grammar (0 unconstrained). */
int kvp_turn_doc_whole(const kvp_turn *t);
/* Frees the turn's matcher. */
void kvp_turn_grammar_free(kvp_turn *t);
/* The next token from logits (modified): the sampler's draw, under the turn's grammar
 * when it has one. Compute only: run inside the step. */
int kvp_turn_draw(kvp_session *s, const kvp_session_env *env, float *logits);
/* The byte trie of env's vocabulary, its end tokens the template's stop tokens. */
int kvp_session_trie_build(struct kvp_vocab_trie *tr, const kvp_session_env *env);
/* Loop, after kvp_session_begin_turn: the turn's tool options (kvp_turn_opts: the
 * message's role, tools, reply_prefix, end_after; copies). 0 or -ENOMEM. */
int kvp_session_turn_tools(kvp_session *s, const kvp_turn_opts *o);
/* Loop, on a new session that never ran a turn: takes copies of msgs as its transcript;
 * its first turn tokenizes and prefills them before its own message. 0 or -ENOMEM. */
int kvp_session_seed(kvp_session *s, const kvp_message *msgs, int n);
/* Loop, on a new session: takes a copy of its system text (len 0: none). 0 or -ENOMEM. */
int kvp_session_set_system(kvp_session *s, const char *system, size_t len);
/* The hash of a conversation's system text and its messages' roles and texts, the same
 * for a session and a request; _more goes on from the state h after earlier messages. */
uint64_t kvp_session_transcript_hash(const char *system, size_t system_len,
                                     const kvp_message *msgs, int n);
uint64_t kvp_session_transcript_hash_more(uint64_t h, const kvp_message *msgs, int n);
/* The hash of the session's whole conversation (system text, dropped and kept messages). */
uint64_t kvp_session_hash(const kvp_session *s);
/* What the transcript index files a conversation under: its hash mixed with its
 * tenant's (kvp_tenant_mix; 0 for the tenant "" of a daemon without API keys), so a
 * request finds only its own tenant's conversations. */
uint64_t kvp_tenant_mix(const char *tenant);
uint64_t kvp_session_index_hash(const kvp_session *s);
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

#endif
