/* kvpd configuration: one table of keys drives the file parser, the flags and --help. */
#include "config/config.h"

#include <assert.h>
#include <ctype.h>
#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "policy/policy.h"
#include "base/fileio.h"
#include "base/parse.h"
#include "generate/generate.h"
#include "model/template.h"
#include "store/store.h"

#ifndef KVPD_DATA_DIR
#define KVPD_DATA_DIR "."
#endif

enum key_type { T_STR, T_INT, T_FLOAT, T_U64, T_BOOL, T_LISTEN, T_BYTES, T_KV_TYPE, T_BUDGET_MODE };

typedef struct key_def {
    const char *name;
    enum key_type type;
    size_t off, size;        /* field offset; buffer size for strings */
    double min, max;         /* numeric range */
    const char *dflt;        /* the default, as it would be written in the file */
    const char *help;
    int live;                /* SIGHUP applies it to the running daemon */
} key_def;

#define F(field) offsetof(kvpd_config, field), sizeof(((kvpd_config *)0)->field)
#define LIVE 1
#define FIXED 0

static const key_def keys[] = {
    {"listen", T_LISTEN, 0, 0, 0, 0, "127.0.0.1:8080", "ADDR:PORT to serve HTTP and websockets on (PORT 0: any)", FIXED},
    {"model", T_STR, F(model), 0, 0, KVPD_DATA_DIR "/models/stories260K.bin", "model file: GGUF or llama2.c checkpoint", FIXED},
    {"tokenizer", T_STR, F(tokenizer), 0, 0, "", "tokenizer.bin for a llama2.c checkpoint", FIXED},
    {"policy", T_STR, F(policy), 0, 0, "", "eviction policy name (empty: kvp with policy_dir/<model stem>.kvp if it exists, else streaming)", LIVE},
    {"policy_file", T_STR, F(policy_file), 0, 0, "", "KVP policy file (policy kvp)", LIVE},
    {"policy_dir", T_STR, F(policy_dir), 0, 0, KVPD_DATA_DIR "/policy/weights", "directory of the default policy's <model stem>.kvp", LIVE},
    {"budget", T_INT, F(budget), 0, 1 << 24, "256", "KV rows kept per head (0: no eviction)", LIVE},
    {"budget_mode", T_BUDGET_MODE, F(budget_mode), 0, 0, "per_head", "per_head: every (layer, KV head) keeps budget rows; global: a session keeps budget x heads rows in all, shared among its heads by calibrated score (each head between a floor and 4 x budget)", FIXED},
    {"kv_type", T_KV_TYPE, F(kv_type), 0, 0, "q8_0", "how KV cache rows are stored: f32, f16 or q8_0 (8-bit blocks of 32 with an f16 scale, keys and values alike); snapshots of another type are converted on load. q8_0 is the default: at equal bytes it keeps more rows and loses less than f16 or f32 rows (docs/quality-per-byte.md)", FIXED},
    {"chunk", T_INT, F(chunk), 1, 4096, KVP_STR(KVP_DEFAULT_CHUNK), "prefill chunk in tokens; a head may exceed the budget by this much", FIXED},
    {"step_tokens", T_INT, F(step_tokens), 1, 65536, "256", "tokens of one batched step, at least chunk: every decoding turn gives one, prefilling turns a chunk each while room is left (the rest wait for the next step)", FIXED},
    {"prefill_tokens", T_INT, F(prefill_tokens), 0, 65536, "0", "prompt tokens one batched step prefills at most (0 or at least chunk; 0: the rows of step_tokens the decoding turns leave): the prompts with the fewest tokens left first (short prompts, returning sessions' new messages), but a prompt passed over 4 steps in a row goes first; lower keeps steps, so inter-token latency, short during a burst of prompts, higher lets a burst's prompts through sooner", FIXED},
    {"workers", T_INT, F(workers), 0, 256, "0", "model worker threads (0: one per core): the first runs the batched steps, the others (at nice 10) the jobs that wait on I/O or take a while without the model meanwhile (snapshot loads and saves, each turn's start and end-of-turn snapshot); one worker runs both", FIXED},
    {"state_dir", T_STR, F(state_dir), 0, 0, "auto", "directory for session state (must be writable when set: refused at start otherwise); auto: $STATE_DIRECTORY (systemd), else $XDG_STATE_HOME/kvpd, else ~/.local/state/kvpd, made 0700 if missing (none with state_url); empty: none (idle sessions are dropped)", FIXED},
    {"state_url", T_STR, F(state_url), 0, 0, "", "redis://HOST[:PORT][/DB]: keep session snapshots in Redis instead, shared by several nodes, with a lease per session (docs/cluster.md; wins over state_dir for snapshots)", FIXED},
    {"snapshot_ttl", T_INT, F(snapshot_ttl_s), 0, 1 << 30, "604800", "seconds a session's snapshot is kept after its last write (7 days; the directory deletes older ones at start and then every ttl/4, at most hourly; Redis keys expire; 0: forever; at least idle_timeout)", FIXED},
    {"max_state_bytes_per_tenant", T_BYTES, F(max_state_bytes_per_tenant), 0, 0, "1G", "state_dir or state_url: bytes of one API key's (tenant's) stored snapshots, .snap and .journal files or Redis snap: values (k/M/G suffixes): after a write takes the tenant past it, that tenant's least recently used snapshots are deleted until it fits, never one of a session in memory or attached, nor another tenant's (without keys every client is one tenant; 0: no bound beyond snapshot_ttl)", FIXED},
    {"max_state_snapshots_per_tenant", T_INT, F(max_state_snapshots_per_tenant), 0, 1 << 30, "100000", "state_dir or state_url: snapshots of one API key (tenant) stored, deleted as max_state_bytes_per_tenant deletes them (0: no bound beyond snapshot_ttl)", FIXED},
    {"lease_ms", T_INT, F(lease_ms), 100, 3600000, KVP_STR(KVP_STORE_DEFAULT_LEASE_MS), "with state_url: a session's lease lasts this long past its last renewal (renewed while a turn runs; released when the client leaves)", FIXED},
    {"node_id", T_STR, F(node_id), 0, 0, "", "with state_url: this node's name in leases, 1..64 of A-Z a-z 0-9 . _ : - (empty: hostname-pid)", FIXED},
    {"admin_token", T_STR, F(admin_token), 0, 0, "", "bearer token required by /admin/* (empty: one is generated at start into admin_token_file)", LIVE},
    {"admin_token_file", T_STR, F(admin_token_file), 0, 0, "", "where the generated admin token is written, mode 0600 (empty: STATE_DIR/admin.token; with neither, /admin/* is closed)", FIXED},
    {"allowed_hosts", T_STR, F(allowed_hosts), 0, 0, "", "comma-separated Host names served, others get 421 (empty: localhost, 127.0.0.1, ::1 and the listen address; *: any)", LIVE},
    {"allowed_origins", T_STR, F(allowed_origins), 0, 0, "", "comma-separated Origins (scheme://host:port) whose pages may use /chat and HTTP, others get 403 (empty: http://<allowed host>:<port>; *: any)", LIVE},
    {"model_alias", T_STR, F(model_alias), 0, 0, "", "comma-separated model ids GET /v1/models lists (empty: the model's own name); with one model loaded any request's model is served unless strict_model_name", LIVE},
    {"strict_model_name", T_BOOL, F(strict_model_name), 0, 1, "false", "API requests must name the model (its own name or a model_alias id); others get 404 model_not_found (false: any name is served, the answer names the real model)", LIVE},
    {"static_dir", T_STR, F(static_dir), 0, 0, KVPD_DATA_DIR "/web/static", "directory of the chat page", FIXED},
    {"max_sessions", T_INT, F(max_sessions), 1, 1 << 20, "64", "sessions resident in memory at once (parked ones do not count)", LIVE},
    {"max_cache_bytes", T_BYTES, F(max_cache_bytes), 0, 0, "0", "KV cache bytes of all resident sessions (k/M/G suffixes; 0: no cap)", LIVE},
    {"api_key", T_STR, F(api_key), 0, 0, "", "comma-separated bearer tokens, one per tenant, that every model endpoint (/v1/* and the /chat websocket: the header on its upgrade or its first frame {\"type\":\"auth\",\"token\":KEY}) requires; a session belongs to the key that made it (empty, and no api_key_file: open, one tenant)", LIVE},
    {"api_key_file", T_STR, F(api_key_file), 0, 0, "", "file of more API keys, one per line ('#' lines skipped), read at start and on SIGHUP", LIVE},
    {"max_body_bytes", T_INT, F(max_body_bytes), 1024, 1 << 26, "1048576", "largest HTTP request body accepted (/v1/chat/completions); larger ones are answered 413", LIVE},
    {"max_message_bytes", T_INT, F(max_message_bytes), 64, 1 << 24, "16384", "largest websocket message accepted", LIVE},
    {"max_tokens", T_INT, F(max_tokens), 0, 1 << 20, "0", "ceiling of a reply in tokens: a request without a limit runs to the end of its turn or to it, a larger limit is cut to it on the OpenAI API and refused on /chat (0: the model's context; without eviction a reply also ends when the context is full)", LIVE},
    {"max_prompt_tokens", T_INT, F(max_prompt_tokens), 0, 1 << 30, "0", "tokens one turn may prefill (its new messages, a new API conversation's whole history): more is refused (too_large; the API's 400 context_length_exceeded) before any prefill (0: the model's context plus budget)", LIVE},
    {"max_history_tokens", T_INT, F(max_history_tokens), 0, 1 << 30, "32768", "transcript tokens a session stores (memory, snapshot, history): past it the oldest whole turns are dropped at the end of a turn, the newest kept; the KV cache is not affected (0: keep everything)", LIVE},
    {"max_cache_bytes_per_tenant", T_BYTES, F(max_cache_bytes_per_tenant), 0, 0, "0", "KV cache bytes of one API key's (tenant's) resident sessions, counted as max_cache_bytes counts them (k/M/G suffixes): a turn that would pass it first parks (dropped without state_dir) that tenant's least recently used idle sessions, and is refused overloaded when all of them are busy; a tenant's only session is never refused by it; at least one turn's bytes when set (0: half of max_cache_bytes with two or more keys and a max_cache_bytes, else no bound beyond max_cache_bytes)", LIVE},
    {"max_sessions_per_tenant", T_INT, F(max_sessions_per_tenant), 0, 1 << 20, "0", "sessions of one API key (tenant) resident at once: a new one parks (dropped without state_dir) that tenant's least recently used idle session, or is refused overloaded when all of them are busy (0: half of max_sessions with two or more keys, else no bound beyond max_sessions)", LIVE},
    {"max_stored_responses_per_tenant", T_INT, F(max_stored_responses_per_tenant), 1, 1 << 20, "1024", "Responses API (store true): stored responses one API key (tenant) keeps, where sessions are kept (state_dir, state_url, or memory without either); storing one more drops that tenant's own oldest, never another tenant's (without keys every client is one tenant)", LIVE},
    {"max_stored_response_bytes_per_tenant", T_BYTES, F(max_stored_response_bytes_per_tenant), 0, 0, "64M", "Responses API: bytes of one API key's (tenant's) stored responses, their records as kept (k/M/G suffixes, at least 64k): storing past it drops that tenant's own oldest until it fits (the newest is always kept), never another tenant's", LIVE},
    {"max_sessions_per_connection", T_INT, F(max_sessions_per_connection), 1, 1 << 20, "8", "conversations one connection may start (sessions it left without a turn do not count)", LIVE},
    {"idle_timeout", T_INT, F(idle_timeout_s), 1, 1 << 30, "1800", "seconds without activity before a session is parked (dropped without state_dir)", LIVE},
    {"max_connections_per_address", T_INT, F(max_connections_per_address), 0, 1 << 20, "64", "connections from one client address at once; more are answered 503 and closed (0: no cap)", LIVE},
    {"max_connections", T_INT, F(max_connections), 0, 1 << 20, "1024", "HTTP and websocket connections at once; more are answered 503 and closed (0: no cap)", LIVE},
    {"connection_idle_timeout", T_INT, F(connection_idle_timeout_s), 0, 1 << 20, "300", "seconds a websocket may go without a frame either way before it is closed (0: never)", LIVE},
    {"shutdown_timeout_ms", T_INT, F(shutdown_timeout_ms), 0, 600000, "5000", "grace period for in-flight turns and snapshots on SIGTERM", LIVE},
    {"temperature", T_FLOAT, F(temperature), 0, 10, "0.8", "sampling temperature when a message gives none (0: greedy)", FIXED},
    {"top_p", T_FLOAT, F(top_p), 0.01, 1, "0.9", "nucleus sampling (1: off)", FIXED},
    {"seed", T_U64, F(seed), 0, 0, "42", "mixed into each session's sampler seed, which comes from getrandom (unpredictable per session; a request's own seed makes its turn reproducible)", FIXED},
    {"fixed_seed", T_BOOL, F(fixed_seed), 0, 1, "false", "an API request (/v1/chat/completions, /v1/completions, /v1/responses, /completion) that gives no seed samples with seed as its own, so the same request gets the same reply, as llama.cpp's server with --seed (false: unpredictable per session)", LIVE},
    {"chat_template", T_STR, F(chat_template), 0, 0, "", "chat template family: chatml, llama3, llama2, mistral, zephyr, phi3, gemma or plain (empty: detected from the model's tokenizer.chat_template)", FIXED},
    {"chat_template_file", T_STR, F(chat_template_file), 0, 0, "", "a Jinja chat template file rendered instead of the model's tokenizer.chat_template (as Hugging Face's apply_chat_template renders it; empty: the model's own)", FIXED},
    {"reuse_cache", T_BOOL, F(reuse_cache), 0, 1, "true", "keep each session's KV cache across turns (false: re-prefill, for benchmarks)", FIXED},
    {"share_prompts", T_BOOL, F(share_prompts), 0, 1, "true", "a new conversation's prompt takes the KV rows of the prefix it shares with another turn of the step (its prefill, or a reply whose prompt starts the same) instead of computing them again, and a prompt whose first chunk another prompt of the step computes waits a step to take them: a burst of prompts that share a system prompt or an opening prefills it once; replies are the same as unshared", FIXED},
    {"share_rows", T_BOOL, F(share_rows), 0, 1, "true", "a fork, a shared prefix and a request's n choices share the KV cache rows they have in common, copied only when one side changes them (false: every fork copies its rows, for comparisons)", FIXED},
    {"canary_rate", T_FLOAT, F(canary_rate), 0, 1, "0.02", "share of turns the eviction canary checks after the fact, on an idle worker: the reply's distributions under eviction against one full-cache prefill (KL and top-1 agreement in /metrics and /admin/stats; skipped while any turn is queued or a step or job runs; 0: off)", LIVE},
    {"learn_dir", T_STR, F(learn_dir), 0, 0, "", "directory where the token ids of a sampled share of whole conversations are kept for kvp learn --transcripts, system prompts included (see learn_exclude_system). The model's vocabulary is public, so these ids ARE the conversations' text: treat the directory as the conversations themselves. One folder per API key (tenant: its 16-hex-digit id, 'default' without keys) that DELETE /v1/learn/transcripts (the key's own) or DELETE /admin/learn/transcripts/TENANT (admin_token) empties; one checksummed file per conversation named by a hash of its session id, 0600 in 0700 folders (empty: none kept)", FIXED},
    {"learn_rate", T_FLOAT, F(learn_rate), 0, 1, "0.1", "with learn_dir: the share of conversations kept", FIXED},
    {"learn_max_bytes", T_BYTES, F(learn_max_bytes), 0, 0, "256M", "with learn_dir: the oldest files are deleted while the directory's transcripts are over this (k/M/G suffixes; 0: no cap)", FIXED},
    {"learn_exclude_system", T_BOOL, F(learn_exclude_system), 0, 1, "false", "with learn_dir: leave each conversation's system prompt's tokens out of its transcript (found by rendering the first message with and without it; a conversation whose system prompt is not found that way is not kept at all)", FIXED},
    {"learn_max_age_days", T_INT, F(learn_max_age_days), 0, 36500, "30", "with learn_dir: transcripts older than this many days are deleted (0: kept)", FIXED},
};

#define N_KEYS (sizeof keys / sizeof keys[0])

void kvpd_config_defaults(kvpd_config *c)
{
    memset(c, 0, sizeof *c);
    char err[256];
    for (size_t i = 0; i < N_KEYS; i++) {
        int rc = kvpd_config_set(c, keys[i].name, keys[i].dflt, err, sizeof err);
        assert(rc == 0);   /* a default outside its own row's range is a bug */
        (void)rc;
    }
}

int kvpd_config_key(size_t i, const char **name, const char **dflt, int *live)
{
    if (i >= N_KEYS)
        return 0;
    *name = keys[i].name;
    *dflt = keys[i].dflt;
    *live = keys[i].live;
    return 1;
}

static const key_def *find_key(const char *name)
{
    for (size_t i = 0; i < N_KEYS; i++)
        if (!strcmp(keys[i].name, name))
            return &keys[i];
    return NULL;
}

static int set_listen(kvpd_config *c, const char *v, char *err, size_t errlen)
{
    const char *colon = strrchr(v, ':');
    if (!colon || colon == v) {
        snprintf(err, errlen, "listen: expected ADDR:PORT, got '%s'", v);
        return -EINVAL;
    }
    size_t hl = (size_t)(colon - v);
    if (v[0] == '[' && hl >= 2 && v[hl - 1] == ']') { /* [::1]:8080 */
        v++;
        hl -= 2;
    }
    long port;
    if (colon[1] == '-' || !kvp_parse_long(colon + 1, 0, 65535, &port)) {
        snprintf(err, errlen, "listen: bad port in '%s'", v);
        return -EINVAL;
    }
    if (hl == 0 || hl >= sizeof c->listen_host) {
        snprintf(err, errlen, "listen: bad address in '%s'", v);
        return -EINVAL;
    }
    memcpy(c->listen_host, v, hl);
    c->listen_host[hl] = '\0';
    c->listen_port = (int)port;
    return 0;
}

int kvpd_config_set(kvpd_config *c, const char *key, const char *value,
                    char *err, size_t errlen)
{
    const key_def *k = find_key(key);
    if (!k) {
        snprintf(err, errlen, "unknown key '%s'", key);
        return -EINVAL;
    }
    char *field = (char *)c + k->off;
    switch (k->type) {
    case T_LISTEN:
        return set_listen(c, value, err, errlen);
    case T_STR:
        if (strlen(value) >= k->size) {
            snprintf(err, errlen, "%s: value too long", key);
            return -EINVAL;
        }
        memcpy(field, value, strlen(value) + 1);
        return 0;
    case T_INT: {
        long v;
        if (!kvp_parse_long(value, (long)k->min, (long)k->max, &v)) {
            snprintf(err, errlen, "%s: expected an integer in [%.0f, %.0f], got '%s'",
                     key, k->min, k->max, value);
            return -EINVAL;
        }
        *(int *)field = (int)v;
        return 0;
    }
    case T_FLOAT: {
        double v;
        if (!kvp_parse_double(value, k->min, k->max, &v)) {
            snprintf(err, errlen, "%s: expected a number in [%g, %g], got '%s'",
                     key, k->min, k->max, value);
            return -EINVAL;
        }
        *(float *)field = (float)v;
        return 0;
    }
    case T_U64: {
        unsigned long long v;
        if (!kvp_parse_u64(value, &v, NULL)) {
            snprintf(err, errlen, "%s: expected an unsigned integer, got '%s'", key, value);
            return -EINVAL;
        }
        *(uint64_t *)field = (uint64_t)v;
        return 0;
    }
    case T_BYTES: {
        unsigned long long v;
        const char *end;
        unsigned shift = 0;
        int ok = kvp_parse_u64(value, &v, &end);
        if (ok && *end && !end[1])
            shift = *end == 'k' || *end == 'K' ? 10 : *end == 'M' ? 20 : *end == 'G' ? 30 : 0;
        /* digits, then at most one suffix letter */
        if (!ok || (*end && !shift) || v > (UINT64_MAX >> shift)) {
            snprintf(err, errlen, "%s: expected a byte count (k, M, G suffixes), got '%s'",
                     key, value);
            return -EINVAL;
        }
        *(uint64_t *)field = (uint64_t)v << shift;
        return 0;
    }
    case T_KV_TYPE: {
        int t = kvp_kv_type_parse(value);
        if (t < 0) {
            snprintf(err, errlen, "%s: expected one of %s, got '%s'", key, kvp_kv_type_names(), value);
            return -EINVAL;
        }
        *(kvp_kv_type *)field = (kvp_kv_type)t;
        return 0;
    }
    case T_BUDGET_MODE: {
        int m = kvp_budget_mode_parse(value);
        if (m < 0) {
            snprintf(err, errlen, "%s: expected per_head or global, got '%s'", key, value);
            return -EINVAL;
        }
        *(int *)field = m;
        return 0;
    }
    case T_BOOL:
        if (!strcmp(value, "true") || !strcmp(value, "yes") || !strcmp(value, "1"))
            *(int *)field = 1;
        else if (!strcmp(value, "false") || !strcmp(value, "no") || !strcmp(value, "0"))
            *(int *)field = 0;
        else {
            snprintf(err, errlen, "%s: expected true or false, got '%s'", key, value);
            return -EINVAL;
        }
        return 0;
    }
    return -EINVAL;
}

static char *trim(char *s)
{
    while (isspace((unsigned char)*s))
        s++;
    size_t n = strlen(s);
    while (n && isspace((unsigned char)s[n - 1]))
        s[--n] = '\0';
    return s;
}

int kvpd_config_load_file(kvpd_config *c, const char *path, char *err, size_t errlen)
{
    FILE *f = kvp_fopen_input(path);
    if (!f) {
        int e = errno;
        snprintf(err, errlen, "%s: %s", path, kvp_fileio_strerror(-e));
        return -e;
    }
    char line[2048], msg[256];
    int lineno = 0, rc = 0;
    while (fgets(line, sizeof line, f)) {
        lineno++;
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(err, errlen, "%s:%d: line too long", path, lineno);
            rc = -EINVAL;
            break;
        }
        /* A '#' before the '=' (or on a line without one) starts a comment. */
        char *eq = strchr(line, '='), *hash = strchr(line, '#');
        if (hash && (!eq || hash < eq)) {
            *hash = '\0';
            eq = NULL;
        }
        char *s = trim(line);
        if (!*s)
            continue;
        if (!eq) {
            snprintf(err, errlen, "%s:%d: expected key = value", path, lineno);
            rc = -EINVAL;
            break;
        }
        *eq = '\0';
        char *key = trim(s), *val = eq + 1;
        while (isspace((unsigned char)*val))
            val++;
        /* A quoted value is taken whole up to its closing quote ('#' and spaces
         * included); only blanks or a comment may follow it. */
        if (*val == '"') {
            char *close = strchr(val + 1, '"');
            char *rest = close ? close + 1 : NULL;
            while (rest && isspace((unsigned char)*rest))
                rest++;
            if (!close || (*rest && *rest != '#')) {
                snprintf(err, errlen, "%s:%d: %s", path, lineno, close
                         ? "text after the closing quote (quoted values cannot hold '\"')"
                         : "no closing quote");
                rc = -EINVAL;
                break;
            }
            *close = '\0';
            val++;
        } else {
            /* Unquoted, '#' starts a comment only after a blank (or as the whole value):
             * "k3y#rest" is more likely a secret with a '#' in it than a key "k3y" and a
             * comment, so it is refused rather than cut. */
            if ((hash = strchr(val, '#'))) {
                if (hash > val && !isspace((unsigned char)hash[-1])) {
                    snprintf(err, errlen, "%s:%d: %s: '#' right after text in an unquoted "
                             "value: quote the value (\"...\") if '#' is part of it, or "
                             "put a blank before the comment", path, lineno, key);
                    rc = -EINVAL;
                    break;
                }
                *hash = '\0';
            }
            val = trim(val);
        }
        if ((rc = kvpd_config_set(c, key, val, msg, sizeof msg)) < 0) {
            snprintf(err, errlen, "%s:%d: %s", path, lineno, msg);
            break;
        }
    }
    if (!rc && ferror(f)) {
        snprintf(err, errlen, "%s: read error", path);
        rc = -EIO;
    }
    fclose(f);
    return rc;
}

/* "--policy-file" -> "policy_file" in buf; NULL when arg is not a long option. */
static const char *flag_key(const char *arg, char *buf, size_t len, const char **inline_val)
{
    if (strncmp(arg, "--", 2))
        return NULL;
    arg += 2;
    const char *eq = strchr(arg, '=');
    size_t n = eq ? (size_t)(eq - arg) : strlen(arg);
    if (n == 0 || n >= len)
        return NULL;
    for (size_t i = 0; i < n; i++)
        buf[i] = arg[i] == '-' ? '_' : arg[i];
    buf[n] = '\0';
    *inline_val = eq ? eq + 1 : NULL;
    return buf;
}

int kvpd_config_from_args(kvpd_config *c, int argc, char **argv, enum kvpd_action *action,
                          char *err, size_t errlen)
{
    kvpd_config_defaults(c);
    *action = KVPD_RUN;
    /* First pass: actions and the config file, so flags override the file. */
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--help") || !strcmp(argv[i], "-h"))
            *action = KVPD_HELP;
        else if (!strcmp(argv[i], "--version"))
            *action = KVPD_VERSION;
        else if (!strcmp(argv[i], "--check-config")) {
            if (*action == KVPD_RUN)
                *action = KVPD_CHECK;
        } else if (!strncmp(argv[i], "--config", 8) &&
                   (argv[i][8] == '\0' || argv[i][8] == '=')) {
            const char *path = argv[i][8] == '=' ? argv[i] + 9 : (i + 1 < argc ? argv[++i] : NULL);
            if (!path) {
                snprintf(err, errlen, "--config needs a FILE");
                return -EINVAL;
            }
            int rc = kvpd_config_load_file(c, path, err, errlen);
            if (rc < 0)
                return rc;
        }
    }
    if (*action == KVPD_HELP || *action == KVPD_VERSION)
        return 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--check-config"))
            continue;
        if (!strcmp(a, "--config")) {
            i++;
            continue;
        }
        if (!strncmp(a, "--config=", 9))
            continue;
        char key[64], msg[256];
        const char *val = NULL;
        if (!flag_key(a, key, sizeof key, &val) ||
            (!find_key(key) && !(!strncmp(key, "no_", 3) && find_key(key + 3)))) {
            snprintf(err, errlen, "unknown option '%s' (see --help)", a);
            return -EINVAL;
        }
        if (!val && !strncmp(key, "no_", 3) && find_key(key + 3) &&
            find_key(key + 3)->type == T_BOOL) { /* --no-reuse-cache */
            memmove(key, key + 3, strlen(key + 3) + 1);
            val = "false";
        }
        if (!val) {
            if (i + 1 >= argc) {
                snprintf(err, errlen, "%s needs a value", a);
                return -EINVAL;
            }
            val = argv[++i];
        }
        int rc = kvpd_config_set(c, key, val, msg, sizeof msg);
        if (rc < 0) {
            snprintf(err, errlen, "%s", msg);
            return rc;
        }
    }
    return 0;
}

/* mkdir -p, the directories it makes 0700. */
static int make_dirs(char *path)
{
    for (char *p = path + 1; ; p++) {
        if (*p != '/' && *p)
            continue;
        char c = *p;
        *p = '\0';
        int rc = mkdir(path, 0700) < 0 && errno != EEXIST ? -errno : 0;
        *p = c;
        if (rc < 0 || !c)
            return rc;
    }
}

int kvpd_config_resolve_state_dir(kvpd_config *c, char *err, size_t errlen)
{
    if (strcmp(c->state_dir, "auto"))
        return 0;
    const char *sd = getenv("STATE_DIRECTORY"), *xdg = getenv("XDG_STATE_HOME"),
               *home = getenv("HOME");
    char dir[KVPD_PATH_MAX];
    int n = -1;
    if (c->state_url[0])   /* the snapshots live in Redis */
        n = snprintf(dir, sizeof dir, "%s", "");
    else if (sd && sd[0] == '/')   /* systemd's StateDirectory= (the first if several) */
        n = snprintf(dir, sizeof dir, "%.*s", (int)strcspn(sd, ":"), sd);
    else if (xdg && xdg[0] == '/')
        n = snprintf(dir, sizeof dir, "%s/kvpd", xdg);
    else if (home && home[0] == '/')
        n = snprintf(dir, sizeof dir, "%s/.local/state/kvpd", home);
    else
        n = snprintf(dir, sizeof dir, "%s", "");   /* nowhere to keep state */
    if (n < 0 || (size_t)n >= sizeof dir) {
        snprintf(err, errlen, "state_dir auto: the path is too long; set state_dir");
        return -ENAMETOOLONG;
    }
    int rc = dir[0] ? make_dirs(dir) : 0;
    if (rc < 0) {
        snprintf(err, errlen, "state_dir auto: cannot make %s (%s); set state_dir (empty: "
                 "none)", dir, strerror(-rc));
        return rc;
    }
    memcpy(c->state_dir, dir, strlen(dir) + 1);
    return 0;
}

static int check_dir(const char *what, const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (stat(path, &st) < 0 || !S_ISDIR(st.st_mode)) {
        snprintf(err, errlen, "%s: '%s' is not a directory", what, path);
        return -ENOTDIR;
    }
    return 0;
}

/* The directory takes a new file: one is made and removed again (permissions alone do
 * not tell, e.g. on a read-only mount). */
static int check_writable(const char *what, const char *dir, char *err, size_t errlen)
{
    char probe[KVPD_PATH_MAX + 32];
    snprintf(probe, sizeof probe, "%s/.kvpd-write-probe-XXXXXX", dir);
    int fd = mkstemp(probe);
    if (fd < 0) {
        int e = errno;
        snprintf(err, errlen, "%s: '%s' is not writable (%s); kvpd writes session snapshots "
                 "there", what, dir, strerror(e));
        return -e;
    }
    close(fd);
    unlink(probe);
    return 0;
}

int kvpd_config_validate(const kvpd_config *c, char *err, size_t errlen)
{
    if (!c->model[0]) {
        snprintf(err, errlen, "model: no model file given");
        return -EINVAL;
    }
    if (!strcmp(c->policy, "oracle") || !strcmp(c->policy, "kvzip")) {
        /* The oracle ranks by the future attention only an evaluator knows; KVzip by a
         * second pass over the whole context at every eviction. */
        snprintf(err, errlen, "policy %s is for evaluation only (kvp eval); kvpd serves "
                 "one of: %s", c->policy, kvp_policy_names());
        return -EINVAL;
    }
    if (!strcmp(c->policy, "kvp") && !c->policy_file[0]) {
        snprintf(err, errlen, "policy kvp needs policy_file");
        return -EINVAL;
    }
    if (c->chat_template[0] && kvp_template_format(c->chat_template) < 0) {
        snprintf(err, errlen, "chat_template '%s' is none of plain, chatml, llama2, llama3, "
                 "mistral, zephyr, phi3, gemma", c->chat_template);
        return -EINVAL;
    }
    if (c->chat_template[0] && c->chat_template_file[0]) {
        snprintf(err, errlen, "chat_template (a family) and chat_template_file exclude each other");
        return -EINVAL;
    }
    if (c->state_dir[0] && strcmp(c->state_dir, "auto")) {   /* (auto: resolved at start) */
        int rc = check_dir("state_dir", c->state_dir, err, errlen);
        if (rc < 0 || (rc = check_writable("state_dir", c->state_dir, err, errlen)) < 0)
            return rc;
    }
    /* Expiry must not reach a session before its idle timeout has parked it: a snapshot
     * younger than idle_timeout may be the only copy of a resident session's turns. */
    if (c->snapshot_ttl_s && c->snapshot_ttl_s < c->idle_timeout_s) {
        snprintf(err, errlen, "snapshot_ttl (%d s) is below idle_timeout (%d s): snapshots of "
                 "sessions still in memory would expire; raise snapshot_ttl or set it to 0",
                 c->snapshot_ttl_s, c->idle_timeout_s);
        return -EINVAL;
    }
    /* A slice below one chunk could never take a prompt's chunk (chunks are not split). */
    if (c->prefill_tokens && c->prefill_tokens < c->chunk) {
        snprintf(err, errlen, "prefill_tokens: %d is below chunk (%d): a step could not "
                 "take one prompt chunk; set it to 0 (no bound) or at least %d",
                 c->prefill_tokens, c->chunk, c->chunk);
        return -EINVAL;
    }
    /* A bound below one small conversation's JSON would keep only the newest response. */
    if (c->max_stored_response_bytes_per_tenant < KVPD_STORED_RESPONSE_BYTES_MIN) {
        snprintf(err, errlen, "max_stored_response_bytes_per_tenant: %llu bytes is below the "
                 "least it may be, 64k", (unsigned long long)c->max_stored_response_bytes_per_tenant);
        return -EINVAL;
    }
    if (c->state_url[0]) {
        kvp_redis_url u;
        int rc = kvp_redis_url_parse(c->state_url, &u, err, errlen);
        if (rc < 0)
            return rc;
    }
    for (const char *p = c->node_id; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') ||
              *p == '.' || *p == '_' || *p == ':' || *p == '-')) {
            snprintf(err, errlen, "node_id: only A-Z a-z 0-9 . _ : - (at most 64)");
            return -EINVAL;
        }
    return check_dir("static_dir", c->static_dir, err, errlen);
}

static int add_key(kvpd_config *c, const char *k, size_t n, const char *where, char *err,
                   size_t errlen)
{
    int ok = n >= 1 && n <= KVPD_API_KEY_MAX;
    for (size_t i = 0; ok && i < n; i++)
        ok = k[i] > ' ' && k[i] < 127 && k[i] != ',';
    if (!ok) {
        snprintf(err, errlen, "%s: an API key is 1 to %d printable characters without spaces "
                 "or commas", where, KVPD_API_KEY_MAX);
        return -EINVAL;
    }
    if (c->n_api_keys >= KVPD_API_KEYS_MAX) {
        snprintf(err, errlen, "%s: more than %d API keys", where, KVPD_API_KEYS_MAX);
        return -EINVAL;
    }
    memcpy(c->api_keys[c->n_api_keys], k, n);
    c->api_keys[c->n_api_keys++][n] = '\0';
    return 0;
}

int kvpd_config_load_keys(kvpd_config *c, char *err, size_t errlen)
{
    c->n_api_keys = 0;
    int rc = 0;
    for (const char *p = c->api_key; *p && rc == 0;) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        const char *a = p, *b = p + n;
        while (a < b && isspace((unsigned char)*a))
            a++;
        while (b > a && isspace((unsigned char)b[-1]))
            b--;
        rc = add_key(c, a, (size_t)(b - a), "api_key", err, errlen);
        p = end ? end + 1 : p + n;
    }
    if (rc < 0 || !c->api_key_file[0])
        return rc;
    FILE *f = kvp_fopen_input(c->api_key_file);
    if (!f) {
        int e = errno;
        snprintf(err, errlen, "api_key_file %s: %s", c->api_key_file, kvp_fileio_strerror(-e));
        return -EINVAL;
    }
    char line[KVPD_API_KEY_MAX + 8], where[KVPD_PATH_MAX + 32];
    int lineno = 0;
    while (rc == 0 && fgets(line, sizeof line, f)) {
        lineno++;
        snprintf(where, sizeof where, "%s:%d", c->api_key_file, lineno);
        if (!strchr(line, '\n') && !feof(f)) {
            snprintf(err, errlen, "%s: line too long", where);
            rc = -EINVAL;
            break;
        }
        char *k = trim(line);
        if (*k && *k != '#')
            rc = add_key(c, k, strlen(k), where, err, errlen);
    }
    fclose(f);
    return rc;
}

void kvpd_config_usage(FILE *f)
{
    fprintf(f,
            "usage: kvpd [--config FILE] [--check-config] [--version] [--help] [--KEY VALUE]...\n"
            "\nFlags override the config file, which overrides the defaults. Every config\n"
            "key is also a flag (underscores as dashes), e.g. --policy-file F, --max-tokens 64.\n\n");
    kvpd_config cfg;
    kvpd_config_defaults(&cfg);
    for (size_t i = 0; i < N_KEYS; i++) {
        char flag[64];
        size_t n = strlen(keys[i].name);
        for (size_t j = 0; j <= n; j++)
            flag[j] = keys[i].name[j] == '_' ? '-' : keys[i].name[j];
        fprintf(f, "  --%-28s %s%s%s%s\n", flag, keys[i].help, keys[i].dflt[0] ? " [" : "",
                keys[i].dflt, keys[i].dflt[0] ? "]" : "");
        if (keys[i].type == T_BOOL)
            fprintf(f, "  --no-%-25s sets %s to false\n", flag, keys[i].name);
    }
    fprintf(f, "\nDefaults in brackets. Without a policy: kvp with %s/<model stem>.kvp if it "
            "exists, else streaming.\n", cfg.policy_dir);
}

int kvpd_config_default_policy(const kvpd_config *c, char *name, size_t name_len,
                               char *file, size_t file_len)
{
    /* The model file's name without its directory and last extension. */
    const char *base = strrchr(c->model, '/');
    base = base ? base + 1 : c->model;
    const char *dot = strrchr(base, '.');
    int stem = dot && dot != base ? (int)(dot - base) : (int)strlen(base);
    struct stat st;
    int n = snprintf(file, file_len, "%s/%.*s.kvp", c->policy_dir, stem, base);
    if (n > 0 && (size_t)n < file_len && stat(file, &st) == 0 && S_ISREG(st.st_mode)) {
        snprintf(name, name_len, "kvp");
        return 1;
    }
    snprintf(name, name_len, "streaming");
    return 0;
}

void kvpd_config_apply_live(kvpd_config *cur, const kvpd_config *next, char *fixed,
                            size_t fixed_len)
{
    size_t used = 0;
    memcpy(cur->api_keys, next->api_keys, sizeof cur->api_keys);   /* from live keys */
    cur->n_api_keys = next->n_api_keys;
    fixed[0] = '\0';
    for (size_t i = 0; i < N_KEYS; i++) {
        const key_def *k = &keys[i];
        int differs = k->type == T_LISTEN
                          ? strcmp(cur->listen_host, next->listen_host) ||
                                cur->listen_port != next->listen_port
                          : memcmp((const char *)cur + k->off, (const char *)next + k->off,
                                   k->type == T_STR ? strlen((const char *)next + k->off) + 1
                                                    : k->size);
        if (!differs)
            continue;
        if (k->live) {
            memcpy((char *)cur + k->off, (const char *)next + k->off, k->size);
        } else if (used + strlen(k->name) + 3 < fixed_len) {
            used += (size_t)snprintf(fixed + used, fixed_len - used, "%s%s", used ? ", " : "",
                                     k->name);
        }
    }
}
