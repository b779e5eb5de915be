/* The hub's state: the hub, a front end's client and the hub's storage, as every file
 * of the hub and the rooms under it that work on the hub's sessions (residency, reuse)
 * see them. Private to sessions/; includes nothing of the hub's own files. Loop thread:
 * the workers touch only the sessions the scheduler hands them. */
#ifndef KVP_HUB_STATE_H
#define KVP_HUB_STATE_H

#include <uv.h>

#include "turns/types.h"
#include "observe/metrics.h"
#include "store/prefix_file.h"
#include "turns/scheduler.h"
#include "turns/session.h"
#include "store/transcripts.h"

struct kvp_hub_storage {
    struct kvp_store *store;         /* NULL: no snapshots */
    kvp_transcripts transcripts;     /* the directory's index, moved into the hub at start */
    kvp_prefix_recs prefix_recs;     /* the directory's prefix file, moved likewise */
    struct kvp_resp_store *resp;     /* stored responses, beside the snapshots (NULL: none) */
};

struct kvp_hub {
    uv_loop_t *loop;
    const kvp_hub_config *cfg;
    kvpd_metrics *m;
    kvp_session_env env;             /* env.store: NULL without persistence */
    kvp_hub_storage *storage;        /* its store and the index read at start; NULL: none */
    kvp_policy_conf *pconf;          /* the policy of new sessions */
    kvp_session_table sessions;
    kvp_transcripts transcripts;     /* every session by transcript hash, on disk ones too */
    kvpd_sched *sched;
    size_t row_bytes;                /* cache bytes per row per head */
    int workers;
    int draining;
    int jobs;                        /* sessions with a job in flight */
    uint64_t clients_made;           /* serial numbers of clients */
    /* Set by a refused admission when nothing running will free room soon: the wait
     * until an idle session times out (ms); 0: about a turn (kvp_hub_retry_hint_ms). */
    int refused_retry_ms;
    struct kvp_vocab_trie *trie;     /* env.trie's memory: made for the first grammar */
    struct kvp_background *bg;       /* canary checks and learn_dir writes (background.h) */
    /* The token prefixes of the conversations held here, for forks (store/prefix.h):
     * a session is put when a job ends with its cache matching its tokens, removed when
     * it leaves the table; NULL when out of memory at start (no index, no token-level
     * forks). */
    struct kvp_prefix_index *prefix;
    /* Requests waiting for a conversation whose turn prefills the prefix they share
     * (sessions/hub_wait.c), and how many. */
    struct hub_wait *waits;
    int n_waits;
    /* Conversations known only from the state directory's prefix file, fork sources
     * once read (sessions/prefix_load.h); NULL: none. */
    struct kvp_prefix_disk *prefix_disk;
    /* Stored responses' thread and the ops in flight (sessions/hub_resp.c). */
    struct hub_resp *resp;
    char *template_src;              /* the chat_template_file's text (NULL: none) */
};

struct kvp_hub_client {
    kvp_hub *hub;
    kvp_hub_sink sink;
    void *ctx;
    kvp_session *session;            /* attached (s->client == this) */
    uint64_t serial;                 /* the session it starts carry it (creator) */
    char tenant[KVP_TENANT_LEN + 1]; /* whose sessions it may use (kvp_hub_client_set_tenant) */
    int created;                     /* sessions it started that still hold a conversation */
    /* A hello with a system text naming a session being read from disk: checked against
     * the session's when the load ends. */
    int check_system;
    char *want_system;
    size_t want_system_len;
    struct kvp_hub_pending *pending; /* a request waiting for its session's snapshot */
    /* A hello's fork waiting for its source's snapshot (hub_fork.c): the source being
     * read (its owner is this client) and the turn to branch at; NULL: none. */
    struct kvp_session *fork_src;
    int fork_turn;
    /* The other choices of its request, started when its turn is done (hub_choices.c);
     * waiting_in: the choices this client is one of, not started yet. */
    struct kvp_hub_choices *choices, *waiting_in;
    /* Its request, waiting for another conversation's turn (sessions/hub_wait.c), and
     * when such a request arrived, for the turn it starts when it goes on (its start
     * time; 0: now; taken by that turn). */
    struct hub_wait *wait;
    double turn_since;
};

#endif
