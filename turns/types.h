/* The values the session hub's API passes (sessions/hub.h): session ids and tenants,
 * the limits of a turn's options, the protocol's error codes, a transcript's messages, a
 * turn's options and statistics, and the events a front end's sink receives. Shapes only:
 * no functions and no thread of their own (values, copied or borrowed for a call). Here,
 * below the hub, because the turns (turns/session.h) carry them too; the hub's files and
 * the front ends (through sessions/hub.h) include it. Sizes are bytes unless named tokens, rows or ms. */
#ifndef KVP_HUB_TYPES_H
#define KVP_HUB_TYPES_H

#include <stddef.h>
#include <stdint.h>

#include "model/logprobs.h"
#include "model/sampler.h"

/* A session id: KVP_SESSION_ID_LEN lowercase hex digits (the hub makes them from a
 * CSPRNG); kvp_session_id_ok is the one test of that form every front end applies. */
#define KVP_SESSION_ID_LEN 32
static inline int kvp_session_id_ok(const char *s)
{
    int n = 0;
    for (; s[n]; n++)
        if (n == KVP_SESSION_ID_LEN || !((s[n] >= '0' && s[n] <= '9') || (s[n] >= 'a' && s[n] <= 'f')))
            return 0;
    return n == KVP_SESSION_ID_LEN;
}
/* A tenant's name: 16 hex digits (of its API key's hash), "" when there are no keys. */
#define KVP_TENANT_LEN 16
/* Stop strings of a turn: at most this many, each 1..KVP_HUB_STOP_MAX bytes. */
#define KVP_HUB_MAX_STOPS 4
#define KVP_HUB_STOP_MAX 256
/* Choices of one stateless request (kvp_hub_chat_choices), at most. */
#define KVP_HUB_MAX_CHOICES 8
/* Bytes of a session's system text, at most. */
#define KVP_HUB_SYSTEM_MAX 32768

/* Error codes of error events (the protocol's, docs/protocol.md). */
#define KVPD_E_BAD_JSON "bad_json"
#define KVPD_E_BAD_REQUEST "bad_request"
#define KVPD_E_BUSY "busy"
#define KVPD_E_TOO_LARGE "too_large"
#define KVPD_E_UNKNOWN_SESSION "unknown_session"
#define KVPD_E_OVERLOADED "overloaded"
#define KVPD_E_INTERNAL "internal"
/* Another node serves the session now (its lease, store/store.h): retry after
 * retry_after_ms, through the balancer (docs/cluster.md). */
#define KVPD_E_ELSEWHERE "elsewhere"

/* A message's `user` for tool results (the client's side of a turn, as a user message's):
 * its text is a JSON array of {"tool_call_id", "name", "content"} objects, which the
 * model's Jinja template renders as tool messages (model/template.h: KVP_CHAT_TOOL). */
#define KVP_MESSAGE_TOOL 2
/* The tools of one request, at most (docs/openai.md). */
#define KVP_HUB_MAX_TOOLS 128

/* One message of a transcript. */
typedef struct kvp_message {
    int user;                /* 1 user, 0 assistant, KVP_MESSAGE_TOOL tool results */
    char *text;              /* valid UTF-8, NUL-terminated, but may hold NULs: use len */
    size_t len;
} kvp_message;

/* Where a turn's cached rows came from: its session's own cache, a copy of another
 * conversation's (a fork), or a shared prefix's. */
enum kvp_reuse_source { KVP_REUSE_OWN = 0, KVP_REUSE_OTHER, KVP_REUSE_SHARED };

typedef struct kvp_turn_stats {
    int prompt_tokens;       /* new tokens of this turn (template + message + leftovers),
                              * the whole transcript after a rebuild */
    int prefilled_tokens;    /* tokens run through the model in prefill this turn */
    int generated_tokens;
    int transcript_tokens;   /* whole conversation so far */
    int context_tokens;      /* the transcript the reply follows (its prompt, whole) */
    int cached_tokens;       /* of those, already in the cache: not recomputed */
    int cached_from;         /* where those rows came from (enum kvp_reuse_source) */
    int cache_rows_max;      /* largest head, peak over the turn's units */
    int cache_rows;          /* largest head after the turn-boundary eviction */
    size_t cache_bytes;
    size_t cache_bytes_max;  /* peak over the turn's units (memory accounting) */
    uint64_t evicted_rows;   /* this turn */
    uint64_t evicted_total;  /* the session's lifetime */
    double ttft_ms, duration_ms, tokens_per_s;
    double queue_ms;         /* from the message to the turn's first step */
    const char *stop;        /* "eos", "length", "cancel", "stop" (a stop string) */
    int stop_word;           /* stop "stop": the index of the turn's stop string that ended
                              * the reply (kvp_turn_opts.stop); -1 otherwise */
    int shaped;              /* a constrained reply whose length budget left out a token the
                              * grammar allowed, or that used all of max_tokens: its document
                              * is whole (stop "eos" or "stop"), but the limit shaped it */
} kvp_turn_stats;

/* One token of a reply with its log-probability (natural log, the model's distribution at
 * temperature 1 before any penalty, bias or grammar: model/logprobs.h). */
typedef struct kvp_hub_logprob {
    int token;
    float logprob;
    const char *bytes;   /* the token's bytes (not NUL-terminated; may hold part of a
                          * UTF-8 character) */
    int len;
} kvp_hub_logprob;

enum kvp_hub_event_type { KVP_HUB_SESSION, KVP_HUB_TOKEN, KVP_HUB_DONE, KVP_HUB_ERROR,
                          KVP_HUB_RESPONSE };

/* Valid during the sink call only. */
typedef struct kvp_hub_event {
    enum kvp_hub_event_type type;
    /* SESSION */
    const char *id;
    int resumed, turns;
    const kvp_message *history;   /* the stored transcript (none while a turn runs) */
    int n_history;
    int history_dropped;          /* earlier messages not stored (max_history_tokens) */
    const char *system;           /* the session's system text (NULL: none) */
    size_t system_len;
    /* TOKEN: the text; DONE: the whole reply; ERROR: the message */
    const char *text;
    size_t len;
    const kvp_turn_stats *stats;  /* DONE */
    int durable;                  /* DONE: 1 the turn is on disk, 0 its snapshot failed
                                   * (durable_error says why), -1 no state directory */
    const char *durable_error;
    const char *code;             /* ERROR: one of KVPD_E_* */
    int retry_after_ms;           /* ERROR: > 0 when trying again later may work */
    /* TOKEN, DONE of a turn with logprobs: n_logprobs reply tokens, the i-th at
     * logprobs[i * (1 + logprobs_top)] followed by its logprobs_top most likely
     * alternatives (most likely first). TOKEN: the tokens whose text is now whole in what
     * was sent (each token once, in order; a stream's last ones may come only with DONE);
     * DONE: every token of the reply whose text is returned (a token a stop string cut
     * into is not). NULL: the turn has none. */
    const kvp_hub_logprob *logprobs;
    int n_logprobs, logprobs_top;
    /* RESPONSE (kvp_hub_response_*): id, and resp_rc 0 (GET: the payload in text, len),
     * -ENOENT (none of the client's tenant's, or a damaged one, refused and logged),
     * -EINVAL (not a response id), another negative errno (the store failed); when not
     * 0, text is a message. */
    int resp_rc;
} kvp_hub_event;

typedef void (*kvp_hub_sink)(void *ctx, const kvp_hub_event *ev);

/* Limits and defaults the hub reads on every call (the daemon changes them on SIGHUP). */
typedef struct kvp_hub_config {
    int budget;                   /* KV rows per head (0: unbounded) */
    int max_tokens;               /* per reply: the ceiling, also the limit of a request
                                   * that gives none (0: the model's context;
                                   * kvp_hub_reply_cap) */
    float temperature;            /* when a message gives none */
    int max_sessions;             /* resident sessions */
    uint64_t max_cache_bytes;     /* KV cache bytes of resident sessions (0: no cap) */
    int idle_timeout_s;
    int max_sessions_per_client;  /* started and not ended unused */
    int max_sessions_per_tenant;  /* resident sessions of one tenant (0: no bound) */
    uint64_t max_cache_bytes_per_tenant;   /* KV cache bytes of one tenant's resident
                                            * sessions, counted as max_cache_bytes counts
                                            * them (0: no bound) */
    int max_history_tokens;       /* transcript tokens a session stores (0: all) */
    int max_prompt_tokens;        /* tokens one turn may prefill (0: the model's context
                                   * plus the budget); more: too_large, before any prefill */
    double canary_rate;           /* share of turns the eviction canary checks (0: none) */
    int max_stored_responses_per_tenant;        /* stored responses of one tenant (>= 1) */
    uint64_t max_stored_response_bytes_per_tenant;   /* their record bytes (0: no bound) */
} kvp_hub_config;

/* The hub, a front end's connection to it, and where its snapshots are kept (their
 * insides: sessions/hub_state.h). */
typedef struct kvp_hub kvp_hub;
typedef struct kvp_hub_client kvp_hub_client;
typedef struct kvp_hub_storage kvp_hub_storage;

/* A turn's options beyond its text; zeros take the configured defaults. */
typedef struct kvp_turn_opts {
    int max_tokens;               /* 0: none, the ceiling (kvp_hub_reply_cap); above it:
                                   * cut to it */
    int has_temperature;
    float temperature;
    int has_top_p;
    float top_p;                  /* (0, 1] */
    int has_seed;
    uint64_t seed;                /* reseeds the session's sampler for this turn */
    /* top-k, min-p, penalties, logit biases (bias borrowed for the call); values the
     * sampler does not take (kvp_sample_opts_check) are bad_request naming the field */
    kvp_sample_opts sampling;
    /* Stop strings (borrowed for the call): the reply ends before the first one that
     * appears, which is never sent as tokens; the session's transcript (and its cache)
     * ends there too, so a client that sends the reply back continues the session. A
     * bad count or length is bad_request. */
    const char *stop[KVP_HUB_MAX_STOPS];
    size_t stop_len[KVP_HUB_MAX_STOPS];
    int n_stop;
    /* Structured output (model/schema.h; borrowed for the call, the hub takes its own
     * reference): the reply is one of the grammar's documents, ending with a stop token
     * once it is whole. NULL: unconstrained. */
    struct kvp_grammar *grammar;
    /* Tool calling (all borrowed for the call; zeros: none). role: the new message's (1
     * user, KVP_MESSAGE_TOOL tool results; kvp_hub_chat takes its last message's).
     * tools: a JSON array (OpenAI's shape) the model's Jinja template renders as `tools`.
     * reply_prefix: text the reply begins with, prefilled rather than sampled (a forced
     * call's opening), part of the reply and the transcript. end_after: the reply ends
     * right after the first appearance of this text, which stays in the reply and the
     * transcript (one call closes the turn). A later constrained decoder takes the
     * functions a call must name from the same place: the prefix names the one. */
    int role;
    const char *tools;
    size_t tools_len;
    const char *reply_prefix;
    size_t reply_prefix_len;
    const char *end_after;
    size_t end_after_len;
    /* Assistant prefill (docs/openai.md): reply_prefix is the client's own unfinished
     * assistant message, which the reply continues. The prompt is the template's
     * rendering of the conversation with that message, cut where its content ends (the
     * families: the reply's opening, then the text as reply text); a template that does
     * not render it verbatim there is bad_request (kvp_hub_prefill_check). The transcript's
     * reply holds it and the new text; tokens and done carry only the new text. */
    int prefill;
    /* Log-probabilities of the reply's tokens (kvp_hub_event.logprobs) with top_logprobs
     * alternatives each (0..KVP_LOGPROBS_MAX_TOP; out of range: bad_request). */
    int logprobs;
    int top_logprobs;
    /* The turn keeps nothing after its answer (a Responses request with store: false):
     * kvp_hub_chat runs it in a session of its own, forked from a held conversation that
     * shares its prefix or seeded with its history, never one it continues or cuts back,
     * and that session is never saved, indexed, leased, logged to learn_dir nor named
     * (no session event), and is dropped at the turn's end. Held sessions stay exactly
     * as they were. kvp_hub_message_opts refuses it (bad_request): a websocket session
     * lasts by design. */
    int ephemeral;
    /* Raw completions (kvp_hub_complete, kvp_hub_complete_tokens): fresh: the prompt is
     * prefilled whole in a session of its own, no cached conversation continued. */
    int fresh;
} kvp_turn_opts;

#endif
