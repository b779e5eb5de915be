/* kvpd configuration: one table of keys (name, type, range, default, help, live) from
 * which come the defaults, the file parser, the flags, --help and SIGHUP's changes:
 * built-in defaults, then a `key = value` file (--config), then
 * command-line flags (--key VALUE or --key=VALUE, dashes for underscores). */
#ifndef KVPD_CONFIG_H
#define KVPD_CONFIG_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "cache/kvrow.h"

#define KVPD_PATH_MAX 512
#define KVPD_API_KEYS_MAX 64
#define KVPD_API_KEY_MAX 200

/* The least max_stored_response_bytes_per_tenant may be. */
#define KVPD_STORED_RESPONSE_BYTES_MIN (64u << 10)

typedef struct kvpd_config {
    char listen_host[64];
    int listen_port;                  /* 0: an ephemeral port, logged at start */
    char model[KVPD_PATH_MAX];
    char chat_template[16];    /* family name; "" = detect */
    char chat_template_file[KVPD_PATH_MAX];   /* a Jinja chat template; "" = the model's */
    char tokenizer[KVPD_PATH_MAX];    /* "" = next to the model */
    char policy[32];                  /* "" = the default (kvpd_config_default_policy) */
    char policy_file[KVPD_PATH_MAX];
    char policy_dir[KVPD_PATH_MAX];   /* where the default policy's <model stem>.kvp is */
    int budget;                       /* KV rows per head; 0 = unbounded */
    kvp_kv_type kv_type;              /* how cache rows are stored */
    int budget_mode;                  /* enum kvp_budget_mode: per head or global */
    int chunk;                        /* prefill chunk = eviction slack */
    int step_tokens;                  /* tokens of one batched step */
    int share_prompts;                /* prompts of a step share their common prefix's rows */
    int prefill_tokens;               /* of them, prefill chunks at most; 0 = no bound */
    int workers;                      /* 0 = one per core */
    char state_dir[KVPD_PATH_MAX];    /* "" none; "auto" until resolved */
    char state_url[KVPD_PATH_MAX];    /* redis://HOST:PORT/DB: snapshots in Redis (wins) */
    int snapshot_ttl_s;               /* snapshots kept this long after their last write */
    uint64_t max_state_bytes_per_tenant;   /* a tenant's snapshot bytes on disk; 0 = none */
    int max_state_snapshots_per_tenant;    /* a tenant's snapshots on disk; 0 = none */
    int lease_ms;                     /* Redis: a session lease's life without renewal */
    char node_id[65];                 /* Redis: this node's name in leases; "" = host-pid */
    char admin_token[128];            /* "" = one is generated at start (web/guard.c) */
    char admin_token_file[KVPD_PATH_MAX];   /* where; "" = <state_dir>/admin.token */
    char api_key[1024];               /* comma-separated keys; "" and no file: no key */
    char api_key_file[KVPD_PATH_MAX]; /* one key per line ("" none) */
    /* The keys of api_key and api_key_file (kvpd_config_load_keys): each a tenant. None:
     * the model endpoints are open and every client is one tenant. */
    char api_keys[KVPD_API_KEYS_MAX][KVPD_API_KEY_MAX + 1];
    int n_api_keys;
    char allowed_hosts[512];          /* Host names served; "" = loopback + listen address */
    char allowed_origins[1024];       /* Origins allowed; "" = this daemon's own */
    char model_alias[512];            /* comma-separated ids /v1/models lists; "" = the name */
    int strict_model_name;            /* 1: a request's model must be the name or an alias */
    char static_dir[KVPD_PATH_MAX];
    int max_sessions;                 /* resident sessions (parked ones do not count) */
    int max_sessions_per_connection;
    int max_sessions_per_tenant;      /* resident sessions of one API key; 0 = see the row */
    int max_history_tokens;           /* stored transcript per session; 0 = unbounded */
    int max_prompt_tokens;            /* tokens one turn may prefill; 0 = context + budget */
    uint64_t max_cache_bytes;         /* KV cache bytes of resident sessions; 0 = no cap */
    uint64_t max_cache_bytes_per_tenant;   /* of one API key's; 0 = see the row */
    int max_stored_responses_per_tenant;   /* Responses API: stored per API key */
    uint64_t max_stored_response_bytes_per_tenant;   /* and their bytes per API key */
    int max_message_bytes;
    int max_body_bytes;               /* HTTP request bodies (/v1/chat/completions) */
    int max_tokens;                   /* per reply: the ceiling (0: the model's context) */
    int idle_timeout_s;
    int max_connections;              /* HTTP and websocket connections at once; 0 = no cap */
    int max_connections_per_address;  /* of them from one client address; 0 = no cap */
    int connection_idle_timeout_s;    /* websocket without frames; 0 = never closed */
    int shutdown_timeout_ms;
    float temperature;                /* default for messages that give none */
    float top_p;
    uint64_t seed;
    int fixed_seed;                   /* 1: an API request without a seed uses seed */
    int reuse_cache;                  /* 0: re-prefill the whole transcript each turn */
    int share_rows;                   /* 0: forks copy their rows instead of sharing them */
    float canary_rate;                /* share of turns the eviction canary checks; 0 off */
    char learn_dir[KVPD_PATH_MAX];    /* transcripts kept for kvp learn; "" none */
    float learn_rate;                 /* share of conversations kept there */
    uint64_t learn_max_bytes;         /* the directory's size cap; 0 none */
    int learn_max_age_days;           /* files older than this are deleted; 0 kept */
    int learn_exclude_system;         /* system prompts are left out of the transcripts */
} kvpd_config;

enum kvpd_action { KVPD_RUN = 0, KVPD_CHECK, KVPD_VERSION, KVPD_HELP };

/* Every key at the default its row in the table gives. */
void kvpd_config_defaults(kvpd_config *c);
/* The i-th key of the table: 1 and its name, default and whether SIGHUP applies it;
 * 0 past the last. */
int kvpd_config_key(size_t i, const char **name, const char **dflt, int *live);
/* Sets one key from its text value; -EINVAL (unknown key, bad value) with a message. */
int kvpd_config_set(kvpd_config *c, const char *key, const char *value,
                    char *err, size_t errlen);
/* Reads a config file: `key = value`, '#' comments, blank lines. Errors name the line. */
int kvpd_config_load_file(kvpd_config *c, const char *path, char *err, size_t errlen);
/* Defaults, then --config FILE, then the other flags over it. */
int kvpd_config_from_args(kvpd_config *c, int argc, char **argv, enum kvpd_action *action,
                          char *err, size_t errlen);
/* state_dir "auto" becomes the directory it stands for ($STATE_DIRECTORY, else
 * $XDG_STATE_HOME/kvpd, else $HOME/.local/state/kvpd; "" with state_url or without any
 * of them), made (0700) if missing. Other values are left alone. 0 or a negative code
 * with a message. */
int kvpd_config_resolve_state_dir(kvpd_config *c, char *err, size_t errlen);
/* Range and consistency checks that need no model. */
int kvpd_config_validate(const kvpd_config *c, char *err, size_t errlen);
/* Fills api_keys from api_key (comma-separated) and api_key_file (one key per line,
 * blank lines and '#' lines skipped; read without blocking on a FIFO): each key 1 to
 * KVPD_API_KEY_MAX printable ASCII characters without spaces or commas, at most
 * KVPD_API_KEYS_MAX. Reads the file system: not on the loop. 0 or -EINVAL with a message. */
int kvpd_config_load_keys(kvpd_config *c, char *err, size_t errlen);
/* The usage text for --help. */
void kvpd_config_usage(FILE *f);

/* The policy when none is configured: "kvp" with <policy_dir>/<model file stem>.kvp if
 * that file exists, else "streaming". Fills name, and file with the path it looked at;
 * returns 1 when it chose kvp. Reads the file system (a stat): not on the loop. */
int kvpd_config_default_policy(const kvpd_config *c, char *name, size_t name_len,
                               char *file, size_t file_len);

/* SIGHUP: copies the keys that can change while running (policy, policy_file,
 * policy_dir, budget, the limits, admin_token, the API keys loaded) from `next` into `cur`, and lists in
 * `fixed` (comma-separated, "" for none) the other keys whose value differs. */
void kvpd_config_apply_live(kvpd_config *cur, const kvpd_config *next, char *fixed,
                            size_t fixed_len);

#endif
