/* Stored responses (the Responses API's `store`, docs/openai.md): opaque records of a
 * tenant's, each named by its response id, kept where the sessions' snapshots are (the
 * store of store/store.h: the state directory, or Redis), or in memory when there is no
 * store. The store knows bytes and tenants, not JSON: the front end above decides what a
 * record holds.
 *
 * A record is written whole: in the directory as responses/<id>.resp by a temporary file,
 * fsync and rename (a crash leaves the old record or the new one, never a torn one), in
 * Redis by one SET in the script that counts it. Its bytes are framed (docs/
 * snapshot-format.md, "Stored responses"): magic, tenant, id, payload, FNV-1a checksum;
 * a record that fails the check is refused (-EBADMSG with a message) and, in the
 * directory, moved aside.
 *
 * Bounds per tenant: after a put, while the tenant holds more than max_count records or
 * more than max_bytes of them, its own oldest other than the one just written are
 * deleted (another tenant's never). Redis keeps the counts in Redis (every node sharing
 * it sees them); the directory counts them from its files' headers at open.
 *
 * Threads: every call blocks (disk or network) except in memory; one thread at a time
 * (the hub's response thread, sessions/hub_resp.c). */
#ifndef KVP_STORE_RESPONSES_H
#define KVP_STORE_RESPONSES_H

#include <stddef.h>
#include <stdint.h>

struct kvp_store;
typedef struct kvp_resp_store kvp_resp_store;

/* A response id: "resp_" and 24 lowercase hex digits; nothing else names a record (no
 * path characters reach a file name). */
#define KVP_RESP_ID_PREFIX "resp_"
#define KVP_RESP_ID_HEX 24
#define KVP_RESP_ID_LEN (5 + KVP_RESP_ID_HEX)
/* A record's payload, at most. */
#define KVP_RESP_PAYLOAD_MAX (64u << 20)
int kvp_resp_id_ok(const char *id);

/* st NULL: in memory (lost at exit). The directory's responses/ is swept of interrupted
 * writes and its records' headers read for the bounds (a damaged one is reported in a
 * warning and left to be refused when read). 0 or a negative code with a message. */
int kvp_resp_open(kvp_resp_store **out, struct kvp_store *st, char *err, size_t errlen);
void kvp_resp_close(kvp_resp_store *rs);
/* "memory", "dir" or "redis". */
const char *kvp_resp_kind(const kvp_resp_store *rs);

/* Writes the tenant's record id (replacing one of the same id), then applies the bounds
 * (max_count >= 1; max_bytes 0: none). *dropped (may be NULL): the tenant's records
 * deleted for them. 0 or a negative code with a message. */
int kvp_resp_put(kvp_resp_store *rs, const char *tenant, const char *id, const void *payload,
                 size_t len, int max_count, uint64_t max_bytes, int *dropped, char *err,
                 size_t errlen);
/* The tenant's record id: its payload (malloc'd, NUL-terminated) in *out, *len. -ENOENT
 * when there is none (or it is another tenant's: the same answer); -EBADMSG when it is
 * damaged (the message says how; the directory's is moved aside); others: the store
 * failed. */
int kvp_resp_get(kvp_resp_store *rs, const char *tenant, const char *id, char **out,
                 size_t *len, char *err, size_t errlen);
/* Deletes the tenant's record id: 0, -ENOENT (none of the tenant's), or another negative
 * code with a message. */
int kvp_resp_remove(kvp_resp_store *rs, const char *tenant, const char *id, char *err,
                    size_t errlen);
/* The tenant's records and their bytes as counted for the bounds (memory and directory:
 * the table; Redis: read from Redis, 0 when it does not answer). */
int kvp_resp_usage(kvp_resp_store *rs, const char *tenant, uint64_t *bytes);

/* The framing (for the tests): encode into a malloc'd buffer (*len); decode checks it
 * and points *payload into buf (NULL: fine; else why not). */
unsigned char *kvp_resp_encode(const char *tenant, const char *id, const void *payload,
                               size_t len, size_t *out_len);
const char *kvp_resp_decode(const unsigned char *buf, size_t len, char *tenant, size_t tlen,
                            char *id, size_t idlen, const unsigned char **payload,
                            size_t *plen);

#endif
