/* What the endpoints show of the hub (/metrics, /admin/stats, /admin/sessions): its
 * configuration and gauges, the sessions one page at a time, and the retry hint of a
 * refused client. Loop thread. */
#include "sessions/hub.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "policy/kvp_agent.h"
#include "observe/background.h"
#include "sessions/hub_impl.h"
#include "store/prefix.h"
#include "sessions/prefix_load.h"
#include "sessions/residency.h"
#include "store/store.h"

/* ---- what the endpoints show ---- */

int kvp_hub_retry_hint_ms(const kvp_hub *h)
{
    /* About one turn's time: a running turn should have ended by then. */
    const kvpd_hist *t = &h->m->turn_duration;
    double ms = t->count ? t->sum / (double)t->count * 1e3 : 100;
    return ms < 50 ? 50 : ms > 5000 ? 5000 : (int)ms;
}

void kvp_hub_info_get(kvp_hub *h, kvp_hub_info *o)
{
    const kvp_model *md = h->env.model;
    memset(o, 0, sizeof *o);
    o->model_name = md->name;
    o->chat_format = kvp_template_name(h->env.tpl.format);
    o->tool_format = h->env.tpl.jinja ? (int)h->env.tpl.tool_format : 0;
    o->reasoning = h->env.tpl.think;
    o->reasoning_open = h->env.tpl.think && h->env.tpl.think_open;
    o->policy = h->pconf->name;
    o->policy_file = h->pconf->file;
    o->state_dir = h->env.state_dir;
    o->kv_type = kvp_kv_type_name(h->env.kv_type);
    o->budget_mode = kvp_budget_mode_name(h->env.budget_mode);
    o->store = h->env.store ? kvp_store_kind(h->env.store) : "";
    o->store_where = h->env.store ? kvp_store_where(h->env.store) : "";
    o->node = h->env.store ? kvp_store_node(h->env.store) : "";
    if (h->env.store) {
        kvp_store_stats ss;
        kvp_store_stats_get(h->env.store, &ss);
        o->lease_conflicts = ss.lease_conflicts;
        o->lease_takeovers = ss.lease_takeovers;
        o->snapshots_expired = ss.expired;
        o->snapshots_over_quota = ss.over_quota;
        o->store_errors = ss.errors;
        o->leases_renewing = ss.leases_renewing;
    }
    o->layers = md->cfg.n_layers;
    o->kv_heads = md->cfg.n_kv_heads;
    o->head_dim = md->cfg.head_dim;
    o->context = md->cfg.seq_len;
    kvp_model_weight_mix(md, o->weights, sizeof o->weights);
    for (int t = 0; t < KVP_N_WEIGHT_TYPES; t++)
        o->weight_bytes += md->type_bytes[t];
    o->chunk = h->env.chunk;
    o->step_tokens = h->env.step_tokens;
    o->workers = h->workers;
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext) {
        o->turns_running += kvp_session_busy(s);
        if (s->bytes > o->cache_bytes_max_session)
            o->cache_bytes_max_session = s->bytes;
    }
    o->sessions_resident = h->sessions.resident;
    o->sessions_parked = h->sessions.count - h->sessions.resident;
    o->sessions_total = h->sessions.created_total;
    o->cache_bytes_accounted = kvp_hub_accounted_bytes(h, &o->cache_bytes_total,
                                                       &o->cache_bytes_shared);
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext)
        o->cache_bytes_borrowed += s->borrowed_bytes;
    o->turn_reserve_bytes = kvp_hub_turn_bytes(h);
    o->prefix_index_bytes = kvp_prefix_bytes(h->prefix) + hub_prefix_disk_bytes(h);
    o->queue_depth = kvpd_sched_depth(h->sched);
    o->policy_file_loads = kvp_agent_set_loads();
    kvp_background_drain(h->bg, h->m);
    o->learn_dir = h->bg ? kvp_background_learnlog(h->bg)->dir : "";
    o->vocab_size = md->cfg.vocab_size;
    o->bos = h->env.tpl_raw.bos;
    o->eos = h->env.tpl_raw.eos;
    for (int i = 0; i < 3; i++)
        o->raw_stop[i] = h->env.tpl_raw.stop[i];
    o->chat_template = h->template_src ? h->template_src
                       : h->env.tpl.jinja && md->chat_template ? md->chat_template : "";
}

int kvp_hub_list(kvp_hub *h, int offset, int limit,
                 void (*fn)(void *ctx, const kvp_hub_session_info *si), void *ctx)
{
    double now = kvp_now();
    int i = 0;
    for (kvp_session *s = h->sessions.head; s && i < offset + limit; s = s->next, i++) {
        if (i < offset)
            continue;
        kvp_hub_session_info si = {
            .id = s->id, .policy = s->pconf->name, .tenant = s->tenant, .turns = s->turns, .rows = s->rows_max,
            .busy = kvp_session_busy(s), .parked = s->state == KVP_SESSION_PARKED,
            .connected = s->client != NULL, .bytes = s->bytes, .evicted_rows = s->evicted_rows,
            .last_active_s_ago = now - s->last_active, .age_s = now - s->created};
        fn(ctx, &si);
    }
    return h->sessions.count;
}
