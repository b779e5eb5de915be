/* An in-process hub on stories260K for tests: a uv loop, the real workers, and fake front
 * ends (clients whose sinks record the events they get). No sockets. */
#ifndef KVP_HUBTEST_H
#define KVP_HUBTEST_H

#include <uv.h>

#include "model/model.h"
#include "sessions/hub.h"
#include "turns/session.h"

#define HT_MAX_EVENTS 4096

typedef struct ht_event {
    enum kvp_hub_event_type type;
    char id[KVP_SESSION_ID_LEN + 1];
    int resumed, turns, n_history;
    char code[32];
    int has_system;          /* SESSION: the session has a system text (below, cut to fit) */
    char system[128];
    char *text;              /* token text, reply, error message */
    kvp_turn_stats stats;
    kvp_hub_logprob *lp;     /* TOKEN, DONE: a copy of the event's logprobs (bytes point
                              * into the model's vocabulary) */
    int n_lp, lp_top;
    int resp_rc;             /* RESPONSE */
} ht_event;

typedef struct ht_client {
    kvp_hub_client *c;
    ht_event ev[HT_MAX_EVENTS];
    int n;
} ht_client;

typedef struct ht_hub {
    uv_loop_t loop;
    kvp_model model;
    kvp_hub_config cfg;
    kvpd_metrics metrics;
    kvp_policy_conf *pc;
    kvp_hub *hub;
    char state_dir[128];
} ht_hub;

/* The hub's share_rows (kvp_hub_params) for the next ht_start: 1 unless a test sets 0
 * (forks copy their rows). */
extern int ht_share_rows;
/* The hub's kv_type for the next ht_start (f32 unless a test sets another). */
extern kvp_kv_type ht_kv_type;
/* Starts a hub (state_dir NULL: none) with the given policy at budget 64, 1 worker. */
void ht_start(ht_hub *h, const char *state_dir, const char *policy);
/* ht_start on streaming with the policy conf made as the daemon makes it
 * (kvp_hub_policy_make): forks need the conf's shared weights, which ht_start's lacks. */
void ht_start_forkable(ht_hub *h, const char *state_dir);
void ht_stop(ht_hub *h);
void ht_client_new(ht_hub *h, ht_client *c);
void ht_client_free(ht_client *c);
/* The end of a test: each client's connection closed (if open) and its events freed,
 * then the hub stopped. */
void ht_finish(ht_hub *h, ht_client *const *clients, size_t n);
/* Runs the loop until c has an event of this type at or after index `from` (or fails
 * the test after timeout_s); returns its index. */
int ht_wait(ht_hub *h, ht_client *c, int from, enum kvp_hub_event_type type, double timeout_s);
/* Runs the loop until no job is in flight. */
void ht_settle(ht_hub *h);
/* The index of c's first event of this type at or after from, or -1. */
int ht_find(const ht_client *c, int from, enum kvp_hub_event_type type);
/* The hub's session with this id (NULL: none); read it only while it is idle. */
kvp_session *ht_session(ht_hub *h, const char *id);
/* A user message of about n tokens of story text. */
char *ht_text(int words);

#endif
