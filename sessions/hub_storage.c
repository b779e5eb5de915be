/* Where the hub keeps snapshots: opened off the loop before the hub starts (the state
 * directory is swept of interrupted writes and expired snapshots, and its transcript
 * index read; a Redis server must answer; the prefix index's lines are read from either),
 * then moved into the hub, which closes it. */
#include "sessions/hub.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "sessions/hub_impl.h"
#include "store/responses.h"
#include "store/store.h"

int kvp_hub_storage_open(kvp_hub_storage **out, const kvp_hub_storage_params *p, char *err,
                         size_t errlen)
{
    *out = NULL;
    kvp_hub_storage *s = calloc(1, sizeof *s);
    if (!s || kvp_transcripts_init(&s->transcripts) < 0) {
        free(s);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    kvp_store_params sp = {.state_dir = p->state_dir, .state_url = p->state_url,
                           .ttl_s = p->ttl_s, .lease_ms = p->lease_ms, .node_id = p->node_id,
                           .tenant_bytes_max = p->tenant_bytes_max,
                           .tenant_snaps_max = p->tenant_snaps_max};
    int rc = kvp_store_open(&s->store, &sp, err, errlen);
    if (rc < 0) {
        kvp_hub_storage_close(s);
        return rc;
    }
    if ((rc = kvp_resp_open(&s->resp, s->store, err, errlen)) < 0) {
        kvp_hub_storage_close(s);
        return rc;
    }
    if (s->store && kvp_store_dir(s->store)[0]) {
        char why[512] = "";
        int n = kvp_transcripts_load(&s->transcripts, kvp_store_dir(s->store), why, sizeof why);
        if (n < 0 || why[0])
            kvpd_log("warning", "state directory: %s", why);
        if (n > 0)
            kvpd_log("info", "state directory: %d conversation(s) in the transcript index", n);
        n = kvp_prefix_file_load(&s->prefix_recs, kvp_store_dir(s->store), why, sizeof why);
        if (n < 0 || why[0])
            kvpd_log("warning", "state directory: %s", why);
        if (n > 0)
            kvpd_log("info", "state directory: %d conversation(s) in the prefix index", n);
    } else if (s->store) {   /* a shared store: the same lines beside the snapshots */
        char why[512] = "";
        int n = kvp_prefix_store_load(&s->prefix_recs, s->store, why, sizeof why);
        if (n < 0 || why[0])
            kvpd_log("warning", "%s: %s", kvp_store_where(s->store), why);
        if (n > 0)
            kvpd_log("info", "%s: %d conversation(s) in the prefix index",
                     kvp_store_where(s->store), n);
    }
    *out = s;
    return 0;
}

void kvp_hub_storage_close(kvp_hub_storage *s)
{
    if (!s)
        return;
    kvp_transcripts_free(&s->transcripts);
    kvp_prefix_recs_free(&s->prefix_recs);
    kvp_resp_close(s->resp);
    kvp_store_close(s->store);   /* releases the leases still held */
    free(s);
}

void kvp_hub_storage_describe(const kvp_hub_storage *s, char *buf, size_t n)
{
    if (!s || !s->store)
        snprintf(buf, n, "(none)");
    else if (kvp_store_dir(s->store)[0])
        snprintf(buf, n, "%s", kvp_store_where(s->store));
    else
        snprintf(buf, n, "%s, node %s", kvp_store_where(s->store), kvp_store_node(s->store));
}
