/* The session hub: the one API every front end (the /chat websocket, the OpenAI API)
 * calls to run conversations. A front end makes one client
 * per connection and calls open (hello: a new session, or resume one by id), message,
 * cancel and close; the hub answers through the client's sink with events: session,
 * token, done, error. Admission (max_sessions, the memory cap), parking, residency,
 * persistence and the scheduling of turns on workers all live behind it. Loop thread
 * only.
 *
 * Attachment rule (docs/protocol.md): a session is attached to at most one client.
 *   - open naming a session attached to another client: while that session has a job in
 *     flight (a turn, or its snapshot being read), the new client gets `busy` and the
 *     first one keeps the session and gets the job's answer (the turn's `done`); while it
 *     is idle, the newest client takes it and the previous one gets `unknown_session`
 *     (its next message starts a new session);
 *   - the events of a turn go to the client that started it; a client that closes
 *     cancels its session's running turn;
 *   - a session that never ran a turn ends as soon as its client leaves it (open of
 *     another session, or close); a client may start at most max_sessions_per_client
 *     sessions that hold a conversation (the ones that ended unused do not count). */
#ifndef KVP_HUB_H
#define KVP_HUB_H

#include <stddef.h>
#include <stdint.h>

#include "cache/kvrow.h"
#include "turns/types.h"
#include "observe/metrics.h"

/* A front end's connection. NULL when out of memory. */
kvp_hub_client *kvp_hub_client_new(kvp_hub *h, kvp_hub_sink sink, void *ctx);
/* The client's tenant (at most KVP_TENANT_LEN characters; "" by default): its new
 * sessions belong to it, and it may open, continue or match only sessions of the same
 * tenant (another's is answered as if it did not exist). Set before its first request. */
void kvp_hub_client_set_tenant(kvp_hub_client *c, const char *tenant);
/* hello: id NULL or "" starts a new session, with the system text when one is given
 * (system_len 0: none); else resumes that session (from memory or disk). A session's
 * system text never changes: resuming with system not NULL requires the session's own
 * (the same bytes; "" for a session without one), else the answer is bad_request and
 * the client is left without a session. A system text over KVP_HUB_SYSTEM_MAX bytes is
 * too_large. */
void kvp_hub_open(kvp_hub_client *c, const char *id, const char *system, size_t system_len);
/* hello with fork (docs/protocol.md, "Forking a conversation"): a new session of c's
 * tenant holding session src_id's system text and its messages up to the end of its
 * turn-th turn (0: the system text only; the source's turn count: all of it), with a copy
 * of src's cache cut back to the longest token prefix that rendering shares with src's
 * tokens, so its first turn prefills only what follows. src is not changed. A source
 * that is parked or only on disk is read first (a load job; the session event follows
 * it). Answers: the session event (resumed 0, turns and history as for a resumed
 * session); unknown_session (no such session, another tenant's, a damaged snapshot),
 * busy (a job runs on src, or c's own session or fork is busy), bad_request (turn past
 * the end, history dropped by max_history_tokens, a src that never ran a turn of its
 * own), overloaded. */
void kvp_hub_open_fork(kvp_hub_client *c, const char *src_id, int turn);
/* A user message: starts a session first when the client has none. max_tokens 0 and
 * !has_temperature take the configured defaults. */
void kvp_hub_message(kvp_hub_client *c, const char *text, size_t len, int max_tokens,
                     int has_temperature, float temperature);

/* kvp_hub_message with the turn's options (kvp_turn_opts, turns/types.h). */
void kvp_hub_message_opts(kvp_hub_client *c, const char *text, size_t len,
                          const struct kvp_turn_opts *o);

/* A stateless request (an OpenAI-style API): system (len 0: none) and msgs[0..n) are the
 * whole conversation, its last message the user's new one. The hub continues the idle
 * session whose system text is `system` and whose transcript is exactly msgs[0..n-1)
 * (matched by a hash of both each session keeps, then compared): the one named by id
 * when it matches, else any other; a busy session is never matched. Without a match, a
 * new session starts holding system and msgs[0..n-1), and its first turn prefills all of
 * them. Either way a session event (resumed 1 for a continued session) comes first, then
 * the turn's events as for kvp_hub_message. The client should be one made for this
 * request: it leaves any session it had. With o->prefill the reply continues the
 * assistant's unfinished message o->reply_prefix after msgs[n-1] (kvp_turn_opts; checked
 * first with kvp_hub_prefill_check). With o->ephemeral (hub_types.h) no session is
 * continued or cut back: the turn runs in a new session forked from (or seeded like)
 * the held conversation it extends, with no session event, and nothing of it is kept. */
void kvp_hub_chat(kvp_hub_client *c, const char *id, const char *system, size_t system_len,
                  const kvp_message *msgs, int n, const kvp_turn_opts *o);
/* An assistant prefill (kvp_turn_opts.prefill) checked before kvp_hub_chat: the
 * conversation system, msgs[0..n) (the user's last) and the assistant's unfinished message
 * prefill[0..prefill_len), with the request's tools (NULL/0: none), as the model's Jinja
 * template renders them, must show that message's content verbatim at the end (the
 * families always do). 0, or -EINVAL (-ENOMEM) with why in err. It reads only the chat
 * template, which does not change while the hub runs, so it may run on any thread (the
 * front end's parse runs it off the loop: the rendering grows with the request). */
int kvp_hub_prefill_check(const kvp_hub *h, const char *system, size_t system_len,
                          const kvp_message *msgs, int n, const char *tools, size_t tools_len,
                          const char *prefill, size_t prefill_len, char *err, size_t errlen);
/* kvp_hub_chat with more choices (sessions/hub_choices.c): c's choice runs as kvp_hub_chat
 * runs it (its session is the conversation a later request continues); once its turn is
 * done, each of more[0..n_more) (clients made for this request, of c's tenant; n_more <
 * KVP_HUB_MAX_CHOICES, else bad_request) gets a new session forked from c's cache cut
 * back to the prompt (only the prompt's last token is run again, for its own logits),
 * whose turn samples with seed o->seed + 1 + i (when o->has_seed); those turns decode in
 * the same batched steps. Each client gets its own events (session, tokens, done or
 * error), more[i]'s only after c's done. A choice that cannot be admitted then gets
 * overloaded; more choices than max_sessions (or max_sessions_per_tenant) ever holds are
 * refused overloaded on c before anything runs. The forked sessions are dropped when
 * their turn ends (never saved, never continued). Closing c forgets the choices not
 * started yet; a more client closed before its choice starts is skipped. */
void kvp_hub_chat_choices(kvp_hub_client *c, kvp_hub_client *const *more, int n_more,
                          const char *id, const char *system, size_t system_len,
                          const kvp_message *msgs, int n, const kvp_turn_opts *o);
/* A raw text completion (sessions/hub_complete.c; for the plain chat format, where a
 * conversation's transcript is its texts end to end): prompt[0..len) is served as a
 * conversation with no system text whose texts concatenate to it. The idle resident
 * session of the client's tenant whose messages form the longest proper prefix of the
 * prompt is continued with the rest as its next message (its cache is reused); without
 * one, a new session takes the whole prompt. Events as for kvp_hub_chat. */
void kvp_hub_complete(kvp_hub_client *c, const char *prompt, size_t len,
                      const kvp_turn_opts *o);
/* Stored responses (the Responses API; sessions/hub_resp.c): records of the client's
 * tenant named by a response id ("resp_" and 24 hex digits), kept in the store that
 * keeps the sessions (the state directory, Redis shared by the nodes of a cluster, or
 * memory without either), within max_stored_responses_per_tenant and
 * max_stored_response_bytes_per_tenant (a put past them deletes the tenant's own
 * oldest). The store's I/O runs off the loop; each call is answered by one
 * KVP_HUB_RESPONSE event (turns/types.h): put once the record is written
 * (durable before the answer), get with its bytes, delete once it is gone. Another
 * tenant's id, like a damaged record, is answered -ENOENT. */
void kvp_hub_response_put(kvp_hub_client *c, const char *id, const char *payload, size_t len);
void kvp_hub_response_get(kvp_hub_client *c, const char *id);
void kvp_hub_response_delete(kvp_hub_client *c, const char *id);
/* A raw completion of a prompt given as token ids (ids[0..n), each below the vocabulary
 * size, else bad_request; n at least 1): a session of its own, as a raw prompt on a model
 * with a chat template is served (never saved, never continued), whose first message is
 * exactly those tokens (nothing added, BOS neither) and whose text is their pieces.
 * Events as for kvp_hub_complete. */
void kvp_hub_complete_tokens(kvp_hub_client *c, const int *ids, int n, const kvp_turn_opts *o);
/* The tokens a raw prompt of text[0..len) is run as (kvp_hub_complete's tokenizer: the
 * vocabulary's, no chat template; a special token's text stays text), BOS first when
 * add_special and the vocabulary has one. The count with *ids malloc'd (NULL when 0), or
 * a negative errno. Like kvp_hub_token_piece it reads only the vocabulary, fixed while
 * the hub runs, so it may run on any thread (the front end tokenizes off the loop). */
int kvp_hub_tokenize(const kvp_hub *h, const char *text, size_t len, int add_special,
                     int **ids);
/* The bytes token id adds after token prev (-1: none; SentencePiece's leading space after
 * BOS is dropped; a special token gives its text), valid while the hub lives; NULL for an
 * id out of range. */
const char *kvp_hub_token_piece(const kvp_hub *h, int prev, int id, size_t *len);
/* Asks the client's running turn to stop (it ends with done, stop "cancel"). */
void kvp_hub_cancel(kvp_hub_client *c);
/* The connection is gone: detaches it from its session (whose turn is cancelled), and
 * frees the client. No event is sent to it afterwards. */
void kvp_hub_close(kvp_hub_client *c);

/* What /metrics and /admin/stats show. */
typedef struct kvp_hub_info {
    const char *model_name, *chat_format, *policy, *policy_file, *state_dir;
    int tool_format;              /* enum kvp_tool_format of the model's Jinja template (0:
                                   * none: no Jinja template, or one without tool calls) */
    int reasoning;                /* the model's replies may open with a reasoning block
                                   * (model/reasoning.h; kvp_template.think) */
    int reasoning_open;           /* reasoning, and a free reply starts inside a block the
                                   * generation prompt opened (kvp_template.think_open) */
    const char *kv_type, *budget_mode;   /* "f32" | "f16" | "q8_0"; "per_head" | "global" */
    const char *store, *store_where, *node;   /* "dir"/"redis"/"" and where; lease name */
    uint64_t lease_conflicts, lease_takeovers, snapshots_expired, store_errors;
    uint64_t snapshots_over_quota;   /* deleted by max_state_bytes_per_tenant */
    int leases_renewing;
    int layers, kv_heads, head_dim, context, chunk, workers, step_tokens;
    int sessions_resident, sessions_parked, turns_running, queue_depth;
    uint64_t sessions_total;      /* ever created */
    size_t cache_bytes_total, cache_bytes_max_session, cache_bytes_accounted;
    /* Of cache_bytes_total, the rows shared between sessions (each block once), and the
     * bytes the sessions read from shared blocks (each block once per reader): a copy per
     * reader would cost cache_bytes_borrowed - cache_bytes_shared more. */
    size_t cache_bytes_shared, cache_bytes_borrowed;
    size_t turn_reserve_bytes;
    size_t prefix_index_bytes;    /* the prefix index's memory (store/prefix.h) */
    char weights[160];            /* weight bytes by type (kvp_model_weight_mix) */
    uint64_t weight_bytes;        /* resident weight bytes, all types */
    uint64_t policy_file_loads;   /* policy files read: once at start, once per reload */
    const char *learn_dir;        /* "" when no transcripts are kept */
    int vocab_size;
    int bos, eos;                 /* the vocabulary's BOS and EOS ids (-1: none) */
    int raw_stop[3];              /* the tokens that end a raw completion's reply (its EOS,
                                   * BOS, end of turn; -1 unused) */
    const char *chat_template;    /* the Jinja source chats are rendered by (the
                                   * chat_template_file's, else the model's); "" for none */
} kvp_hub_info;

typedef struct kvp_hub_session_info {
    const char *id, *policy, *tenant;
    int turns, rows, busy, parked, connected;
    size_t bytes;
    uint64_t evicted_rows;
    double last_active_s_ago, age_s;
} kvp_hub_session_info;

void kvp_hub_info_get(kvp_hub *h, kvp_hub_info *out);
/* The longest reply in tokens: the max_tokens setting, or with 0 the model's context
 * (past which, without eviction, the turn's tokens do not fit anyway). A turn without a
 * limit of its own runs to it; a larger limit is cut to it. */
int kvp_hub_reply_cap(const kvp_hub *h);
/* Calls fn for at most `limit` sessions from the offset-th (in creation order); returns
 * the number of sessions in all. */
int kvp_hub_list(kvp_hub *h, int offset, int limit,
                 void (*fn)(void *ctx, const kvp_hub_session_info *si), void *ctx);
/* Milliseconds a refused client should wait before trying again. */
int kvp_hub_retry_hint_ms(const kvp_hub *h);

/* ---- for the daemon that runs the hub ---- */

struct uv_loop_s;
struct kvp_model;
struct kvp_policy_conf;

/* Where snapshots are kept: a state directory (with its transcript index), Redis, or
 * neither. Opened off the loop, since it blocks: the directory is swept of interrupted
 * writes and expired snapshots and its index read (warnings go to the log); a Redis
 * server must answer. Neither dir nor url: a storage without snapshots. */
typedef struct kvp_hub_storage_params {
    const char *state_dir;        /* NULL or "": none */
    const char *state_url;        /* redis://HOST[:PORT][/DB]; NULL or "": none */
    double ttl_s;                 /* snapshots unused this long are deleted (s); 0: kept */
    uint64_t tenant_bytes_max;    /* directory: one tenant's snapshot bytes (0: no bound) */
    int tenant_snaps_max;         /* directory: one tenant's snapshots (0: no bound) */
    int lease_ms;                 /* Redis: a session's lease lasts this long unrenewed */
    const char *node_id;          /* Redis: this node's name in leases; NULL or "": host-pid */
} kvp_hub_storage_params;
int kvp_hub_storage_open(kvp_hub_storage **out, const kvp_hub_storage_params *p, char *err,
                         size_t errlen);
void kvp_hub_storage_close(kvp_hub_storage *s);
/* For the log: "(none)", the directory, or the Redis address and this node's name. */
void kvp_hub_storage_describe(const kvp_hub_storage *s, char *buf, size_t n);

typedef struct kvp_hub_params {
    struct uv_loop_s *loop;
    const struct kvp_model *model;
    const kvp_hub_config *cfg;    /* read live; owned by the caller */
    kvpd_metrics *metrics;        /* counters the hub adds to; owned by the caller */
    struct kvp_policy_conf *policy;   /* the policy of new sessions (a reference is taken) */
    /* Where snapshots go (kvp_hub_storage_open), moved into the hub, which closes it when
     * it is freed (also when kvp_hub_start fails); NULL: no snapshots, no parking. */
    struct kvp_hub_storage *storage;
    int chunk, workers, reuse_cache;
    int share_rows;               /* forks share their rows (kvp_session_env.share_rows) */
    kvp_kv_type kv_type;          /* how session caches store their rows */
    int budget_mode;              /* enum kvp_budget_mode (policy/policy.h) */
    int step_tokens;              /* tokens of one batched step (decodes + prefill chunks) */
    int share_prompts;            /* prompts of a step share a common prefix's rows */
    int prefill_tokens;           /* of them, prefill chunks at most (0: what decodes leave) */
    float top_p;
    uint64_t seed;
    const char *chat_template;    /* family name (config chat_template); NULL/"" = detect */
    const char *chat_template_file;   /* a Jinja template (config chat_template_file) rendered
                                         instead of the model's; NULL/"" = the model's */
    /* Transcripts kept for learning (observe/learnlog.h): NULL/"" for none. */
    const char *learn_dir;
    double learn_rate;            /* share of conversations kept */
    uint64_t learn_max_bytes;     /* the directory's size cap (0: none) */
    double learn_max_age_s;       /* files older than this are deleted (0: kept) */
    int learn_exclude_system;     /* the system prompt's tokens are not kept */
} kvp_hub_params;

/* The policy of new sessions (kvp_hub_params.policy, kvp_hub_set_policy), made off the
 * loop: it loads the policy's file once for every session that takes it, and hashes the
 * model and policy files for the snapshots' identity. */
typedef struct kvp_hub_policy_params {
    const char *policy;        /* a policy name; NULL or "": the default */
    const char *policy_file;   /* the "kvp" policy's file (ignored by the others) */
    /* The default: the file found for this model (kvp), or NULL (streaming), and the
     * path that was looked at (for the note). A default file that does not load falls
     * back to streaming with a note saying why. */
    const char *default_file, *looked;
    const char *model_path;    /* the model's file: its identity, and the notes' hint */
} kvp_hub_policy_params;
/* 0 with *out (one reference) and note saying what was chosen, for the log; or a negative
 * errno with a message. */
int kvp_hub_policy_make(const kvp_hub_policy_params *p, const struct kvp_model *model,
                        struct kvp_policy_conf **out, char *note, size_t notelen, char *err,
                        size_t errlen);
void kvp_hub_policy_unref(struct kvp_policy_conf *pc);
const char *kvp_hub_policy_name(const struct kvp_policy_conf *pc);
/* The file the policy was loaded from; "" when it has none. */
const char *kvp_hub_policy_file(const struct kvp_policy_conf *pc);
/* Every policy name, for --help. */
const char *kvp_hub_policy_names(void);
/* One turn's cache reservation under a budget and policy (the memory cap must hold it). */
size_t kvp_hub_turn_bytes_for(const struct kvp_model *m, kvp_kv_type kv_type, int budget,
                              int chunk, const struct kvp_policy_conf *pc, int budget_mode);

/* Starts the workers. On failure *out may be set: stop and free it as below. */
int kvp_hub_start(kvp_hub **out, const kvp_hub_params *p, char *err, size_t errlen);
/* New sessions, and sessions coming back from disk, take pc (a reference is taken). */
void kvp_hub_set_policy(kvp_hub *h, struct kvp_policy_conf *pc);
/* The idle timeout (call about once a second): with a state directory, parks idle
 * sessions and lets go of parked ones nobody is attached to after another timeout;
 * without one, drops idle sessions (telling an attached client). */
void kvp_hub_expire(kvp_hub *h, double now);
/* Shutdown: new sessions and turns are refused, running turns are asked to stop.
 * Returns the jobs still running. */
int kvp_hub_drain(kvp_hub *h);
/* Sessions whose last snapshot write failed (turns a client saw that are not on disk):
 * the daemon reports itself degraded and exits non-zero while any remain. */
int kvp_hub_unsaved(const kvp_hub *h);
/* Jobs (turns, snapshot loads and saves) in flight. */
int kvp_hub_jobs(const kvp_hub *h);
/* Deletes the tenant's transcripts in learn_dir ("": a daemon without keys), those
 * waiting to be written too; how many files went in *deleted. 0; -EOPNOTSUPP without
 * learn_dir; -ENOENT when the tenant has none kept (no folder); -EINVAL for a name that
 * is no tenant's; another negative errno with a message. A conversation that goes on is
 * kept again on its next turn when it is one of the sampled share. */
int kvp_hub_learn_forget(kvp_hub *h, const char *tenant, int *deleted, char *err,
                         size_t errlen);
/* Queues one more snapshot write for every session whose last one failed; returns how
 * many. */
int kvp_hub_save_unsaved(kvp_hub *h);
/* Joins the workers (queued jobs are abandoned); the loop must run to close the
 * scheduler's handle before kvp_hub_free. */
void kvp_hub_stop(kvp_hub *h);
void kvp_hub_free(kvp_hub *h);

#endif
