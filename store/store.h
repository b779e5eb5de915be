/* Where session snapshots live (docs/cluster.md): the state directory (one node, the
 * files of store/snapshot.h) or a Redis server (`state_url = redis://HOST:PORT/DB`,
 * several nodes sharing the sessions). Both keep the same checksummed snapshot bytes,
 * move a damaged one aside (never loaded again) and forget snapshots older than the
 * time to live.
 *
 * Threads: put, get, remove and lease_take block (disk or network) and run on the
 * workers, as snapshot I/O always has; each call may come from any thread. lease_drop
 * and the counters only take a mutex: the loop may call them. The store's own thread
 * renews the leases of sessions with a job in flight, releases dropped ones and, for the
 * directory, deletes expired snapshots. */
#ifndef KVP_STORE_H
#define KVP_STORE_H

#include <stddef.h>
#include <stdint.h>

#include "store/snapshot.h"

#define KVP_STORE_NODE_MAX 64

typedef struct kvp_store kvp_store;

/* How long a session's lease lasts unrenewed when the settings do not say. */
#define KVP_STORE_DEFAULT_LEASE_MS 10000

typedef struct kvp_store_params {
    const char *state_dir;        /* "" or NULL: none */
    const char *state_url;        /* redis://HOST:PORT/DB, wins over state_dir; "" or NULL */
    double ttl_s;                 /* snapshots unused this long are deleted (0: never) */
    int lease_ms;                 /* Redis: a session's lease lasts this long unrenewed (0: KVP_STORE_DEFAULT_LEASE_MS) */
    const char *node_id;          /* Redis: this node's name in leases ("" : host-pid) */
    double expire_every_s;        /* directory: how often expired files are looked for */
    uint64_t tenant_bytes_max;    /* the bytes of one tenant's snapshots (directory: .snap
                                   * and .journal; Redis: the snap: values); past it,
                                   * after a write, that tenant's least recently used
                                   * snapshots that are not live (Redis: nor leased by any
                                   * node) are deleted (0: no bound) */
    int tenant_snaps_max;         /* the same for the count of one tenant's snapshots
                                   * (0: no bound) */
} kvp_store_params;

/* A parsed redis:// URL. */
typedef struct kvp_redis_url {
    char host[256];
    int port;                     /* 1..65535, default 6379 */
    int db;                       /* 0..15 by default Redis; any 0..(1<<20) accepted */
} kvp_redis_url;

/* redis://HOST[:PORT][/DB]; HOST is a name or IPv4 ([v6] in brackets). 0 or -EINVAL with
 * a message naming what is wrong. */
int kvp_redis_url_parse(const char *url, kvp_redis_url *out, char *err, size_t errlen);

/* Opens the store the parameters name (neither dir nor url: *out NULL, returns 0). For
 * Redis the server must answer now (a clear error otherwise). At start, before any
 * write: a directory's leftover temporary files and expired snapshots are deleted. */
int kvp_store_open(kvp_store **out, const kvp_store_params *p, char *err, size_t errlen);
/* Stops the store's thread, releases every lease still held, frees it. */
void kvp_store_close(kvp_store *st);

/* "dir" or "redis", and where (the directory, or host:port/db). */
const char *kvp_store_kind(const kvp_store *st);
const char *kvp_store_where(const kvp_store *st);
/* The directory when the store is one, else "" (the transcript index lives only there). */
const char *kvp_store_dir(const kvp_store *st);
const char *kvp_store_node(const kvp_store *st);

/* Writes a whole snapshot (replacing the journal, if the store keeps one). *bytes: what
 * was written. *version: in, the stored version this copy descends from (what the last
 * get or put of it gave; 0 for a session never stored); out, the version written (the
 * directory leaves it). 0 or a negative code with a message; -ESTALE (Redis): nothing
 * was written, because another node holds the session's lease or the stored session has
 * moved past *version (another node wrote it since): this copy is stale. */
int kvp_store_put(kvp_store *st, const kvp_snapshot *snap, uint64_t *version, size_t *bytes,
                  char *err, size_t errlen);
/* The same, for a turn's own write: with leases, the write also needs this node's lease
 * still live in the store under its newest token (not run out, even when nobody has
 * taken it since); otherwise -ESTALE and nothing is written. */
int kvp_store_put_leased(kvp_store *st, const kvp_snapshot *snap, uint64_t *version,
                         size_t *bytes, char *err, size_t errlen);
/* 1 when the store keeps journals (kvp_store_append may be called), else 0. */
int kvp_store_has_journal(const kvp_store *st);
int kvp_store_append(kvp_store *st, const char *id, const kvp_journal_rec *rec,
                     size_t *journal_bytes, size_t *bytes, char *err, size_t errlen);
/* Reads a snapshot and replays its journal. -ENOENT none; -EBADMSG damaged (moved aside:
 * the message says where); others may pass. *version: the stored version read (0: the
 * directory, or none). *journal_clean: 0 when a journal tail was ignored (jerr says why;
 * the next write must be whole). */
int kvp_store_get(kvp_store *st, const char *id, kvp_snapshot *out, uint64_t *version,
                  size_t *journal_bytes, int *journal_clean, char *jerr, size_t jerrlen,
                  char *err, size_t errlen);
int kvp_store_exists(kvp_store *st, const char *id);
int kvp_store_remove(kvp_store *st, const char *id, char *err, size_t errlen);
/* Calls fn for each stored session id; returns how many, or a negative code. */
int kvp_store_list(kvp_store *st, void (*fn)(void *ctx, const char *id), void *ctx,
                   char *err, size_t errlen);
/* Deletes snapshots unused for longer than the time to live (the directory; Redis lets
 * its keys expire by themselves). Never those of live sessions (below). Returns how
 * many, or a negative code. */
int kvp_store_expire(kvp_store *st, char *err, size_t errlen);
/* The sessions this node holds live: in memory or attached. Their snapshots never
 * expire, however old: the directory's sweep skips them, and Redis has their keys' time
 * to live renewed by the store's thread at every sweep. Replaces the set (the ids are
 * copied); a snapshot read or written is live until the next call. No I/O: the loop may
 * call it. 0, or -ENOMEM (the previous set stays). st may be NULL. */
int kvp_store_set_live(kvp_store *st, const char *const *ids, int n);

/* Leases (Redis; a directory has a single node, which always holds them). A session is
 * served by the node holding its lease: taken by the worker before a job (a load or a
 * turn; a snapshot write checks or takes it itself), renewed by the store's thread while the job runs and by every snapshot
 * write, left to expire lease_ms after the last one, released at once when the node parks
 * or forgets the session or shuts down. Every take issues a new fencing token (a counter
 * in Redis that only grows); renewals, releases and writes act only while their token is
 * the newest, so a release queued before a later take never removes the later lease. A
 * snapshot's version is the token of the lease it was written under: a later owner's
 * always exceeds it (docs/cluster.md, "The write protocol"). */
enum { KVP_LEASE_OTHER = 0, KVP_LEASE_HELD = 1, KVP_LEASE_NEW = 2 };
/* 1 when the store has leases (Redis: several nodes), 0 for the directory. */
int kvp_store_has_leases(const kvp_store *st);
/* Takes or renews the session's lease: KVP_LEASE_HELD (this node's already: renewed),
 * KVP_LEASE_NEW (it was free or an older lease of this node's name, taken now), with
 * *stored_turns and *stored_version those of the stored snapshot (-1 and 0: none): a copy
 * in memory whose version differs is older than the store and must be read again;
 * KVP_LEASE_OTHER (another node holds it: its name in holder, *left_ms until it runs out
 * unless renewed), or a negative code. The store's thread renews it until
 * kvp_store_lease_idle or _drop. */
int kvp_store_lease_take(kvp_store *st, const char *id, int *stored_turns,
                         uint64_t *stored_version, int *left_ms, char *holder,
                         size_t holder_len, char *err, size_t errlen);
/* How long this node's lease on the session surely lasts (ms, from its last take,
 * renewal or write that Redis answered; 0: none or run out; INT_MAX for the directory).
 * While the store cannot be reached, a session is served from memory only so long. Any
 * thread. */
int kvp_store_lease_left_ms(kvp_store *st, const char *id);
/* How much of the lease a turn leaves unused (ms; 0 without leases): a turn emits its
 * output only while kvp_store_lease_left_ms exceeds it, so the output reaches its client
 * before the lease can run out in the store. A fifth of lease_ms. Any thread. */
int kvp_store_lease_margin_ms(const kvp_store *st);
/* The job ended: no more renewals (the lease runs out lease_ms after the last). Loop-safe. */
void kvp_store_lease_idle(kvp_store *st, const char *id);
/* The node lets go of the session (parked, removed): released in the background
 * (compare-and-delete on the token: never another node's, nor a later take's). Loop-safe. */
void kvp_store_lease_drop(kvp_store *st, const char *id);

/* The bytes of a tenant's snapshots the store counts, and (snapshots, may be NULL)
 * how many: the directory's (0 without a bound), or Redis's totals (read from Redis:
 * blocks; 0 when it does not answer). Any thread. */
uint64_t kvp_store_quota_tenant_bytes(kvp_store *st, const char *tenant, int *snapshots);

/* Hints (Redis only; -ENOTSUP otherwise): a small value kept beside a session's snapshot
 * under hint:<id>, deleted and renewed with the snapshot but outside its write protocol
 * (no lease, no version), so a reader checks it against the snapshot it names. put: replaces
 * id's (a worker, after the snapshot's write). each: fn for every stored hint whose value
 * is 1..max bytes, reading at most max + 1 bytes of any (*skipped counts the others); 0
 * or a negative code with a message. Both block on Redis. */
int kvp_store_hint_put(kvp_store *st, const char *id, const void *val, size_t len,
                       char *err, size_t errlen);
int kvp_store_hint_each(kvp_store *st, size_t max,
                        void (*fn)(void *ctx, const char *id, const void *val, size_t len),
                        void *ctx, int *skipped, char *err, size_t errlen);

/* Counters since open (any thread). */
typedef struct kvp_store_stats {
    uint64_t lease_conflicts;     /* takes refused: another node held the lease */
    uint64_t lease_takeovers;     /* takes of a free lease for a session in memory whose
                                   * stored snapshot had moved on (reloaded) */
    uint64_t expired;             /* snapshots deleted by the time to live (directory) */
    uint64_t over_quota;          /* snapshots deleted by tenant_bytes_max or _snaps_max */
    uint64_t errors;              /* store calls that failed (network, disk) */
    int leases_renewing;
} kvp_store_stats;
void kvp_store_stats_get(kvp_store *st, kvp_store_stats *out);
/* Worker: a snapshot that moved on under a NEW lease (counted in lease_takeovers). */
void kvp_store_note_takeover(kvp_store *st);

#endif
