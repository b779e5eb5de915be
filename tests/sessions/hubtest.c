#include "tests/sessions/hubtest.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/clock.h"
#include "sessions/hub_impl.h"
#include "tests/model/testutil.h"

int ht_share_rows = 1;
kvp_kv_type ht_kv_type = KVP_KV_F32;

void ht_start(ht_hub *h, const char *state_dir, const char *policy)
{
    memset(h, 0, sizeof *h);
    cr_assert_eq(uv_loop_init(&h->loop), 0);
    char err[512];
    cr_assert_eq(kvp_model_load(&h->model, tu_shared("models/stories260K.bin"),
                                tu_shared("models/tok512.bin"), err, sizeof err), 0, "%s", err);
    h->cfg = (kvp_hub_config){.budget = 64, .max_tokens = 256, .temperature = 0.0f,
                              .max_sessions = 64, .max_cache_bytes = 0,
                              .idle_timeout_s = 1800, .max_sessions_per_client = 8};
    kvpd_metrics_init(&h->metrics);
    h->pc = calloc(1, sizeof *h->pc);
    h->pc->refs = 1;
    snprintf(h->pc->name, sizeof h->pc->name, "%s", policy);
    snprintf(h->pc->ident.model_name, sizeof h->pc->ident.model_name, "%s", h->model.name);
    snprintf(h->pc->ident.policy_name, sizeof h->pc->ident.policy_name, "%s", policy);
    snprintf(h->state_dir, sizeof h->state_dir, "%s", state_dir ? state_dir : "");
    kvp_hub_storage *storage;
    kvp_hub_storage_params sp = {.state_dir = h->state_dir};
    cr_assert_eq(kvp_hub_storage_open(&storage, &sp, err, sizeof err), 0, "%s", err);
    kvp_hub_params p = {.loop = &h->loop, .model = &h->model, .cfg = &h->cfg,
                        .metrics = &h->metrics, .policy = h->pc, .storage = storage,
                        .chunk = 32, .workers = 1, .reuse_cache = 1, .share_rows = ht_share_rows,
                        .kv_type = ht_kv_type, .top_p = 0.9f,
                        .seed = 42};
    cr_assert_eq(kvp_hub_start(&h->hub, &p, err, sizeof err), 0, "%s", err);
}

void ht_start_forkable(ht_hub *h, const char *state_dir)
{
    ht_start(h, state_dir, "streaming");
    kvp_hub_policy_params pp = {.policy = "streaming",
                                .model_path = tu_shared("models/stories260K.bin")};
    kvp_policy_conf *pc;
    char note[256], err[256];
    cr_assert_eq(kvp_hub_policy_make(&pp, &h->model, &pc, note, sizeof note, err, sizeof err),
                 0, "%s", err);
    kvp_hub_set_policy(h->hub, pc);
    kvp_hub_policy_unref(pc);
}

static void walk_close(uv_handle_t *hd, void *arg)
{
    (void)arg;
    if (!uv_is_closing(hd))
        uv_close(hd, NULL);
}

void ht_stop(ht_hub *h)
{
    kvp_hub_stop(h->hub);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    kvp_hub_free(h->hub);
    kvp_policy_conf_unref(h->pc);
    kvp_model_free(&h->model);
    uv_walk(&h->loop, walk_close, NULL);
    uv_run(&h->loop, UV_RUN_DEFAULT);
    cr_assert_eq(uv_loop_close(&h->loop), 0);
}

static void sink(void *ctx, const kvp_hub_event *e)
{
    ht_client *c = ctx;
    cr_assert_lt(c->n, HT_MAX_EVENTS);
    ht_event *r = &c->ev[c->n++];
    memset(r, 0, sizeof *r);
    r->type = e->type;
    if (e->id)
        snprintf(r->id, sizeof r->id, "%s", e->id);
    r->resumed = e->resumed;
    r->turns = e->turns;
    r->n_history = e->n_history;
    r->resp_rc = e->resp_rc;
    r->has_system = e->system != NULL;
    if (e->system)
        snprintf(r->system, sizeof r->system, "%.*s", (int)e->system_len, e->system);
    if (e->code)
        snprintf(r->code, sizeof r->code, "%s", e->code);
    if (e->text) {
        r->text = malloc(e->len + 1);
        memcpy(r->text, e->text, e->len);
        r->text[e->len] = '\0';
    }
    if (e->stats)
        r->stats = *e->stats;
    if (e->logprobs) {
        size_t n = (size_t)e->n_logprobs * (size_t)(1 + e->logprobs_top);
        r->lp = malloc(n * sizeof *r->lp + 1);
        cr_assert(r->lp);
        memcpy(r->lp, e->logprobs, n * sizeof *r->lp);
        r->n_lp = e->n_logprobs;
        r->lp_top = e->logprobs_top;
    }
}

kvp_session *ht_session(ht_hub *h, const char *id)
{
    return kvp_session_find(&h->hub->sessions, id);
}

void ht_client_new(ht_hub *h, ht_client *c)
{
    memset(c, 0, sizeof *c);
    c->c = kvp_hub_client_new(h->hub, sink, c);
    cr_assert(c->c);
}

void ht_client_free(ht_client *c)
{
    for (int i = 0; i < c->n; i++) {
        free(c->ev[i].text);
        free(c->ev[i].lp);
    }
    c->n = 0;
}

void ht_finish(ht_hub *h, ht_client *const *clients, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (clients[i]->c)
            kvp_hub_close(clients[i]->c);
        clients[i]->c = NULL;
        ht_client_free(clients[i]);
    }
    ht_stop(h);
}

int ht_find(const ht_client *c, int from, enum kvp_hub_event_type type)
{
    for (int i = from; i < c->n; i++)
        if (c->ev[i].type == type)
            return i;
    return -1;
}

int ht_wait(ht_hub *h, ht_client *c, int from, enum kvp_hub_event_type type, double timeout_s)
{
    double end = kvp_now() + timeout_s;
    int i;
    while ((i = ht_find(c, from, type)) < 0) {
        cr_assert_lt(kvp_now(), end, "no event of type %d after %d", (int)type, from);
        uv_run(&h->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
    return i;
}

void ht_settle(ht_hub *h)
{
    double end = kvp_now() + 30;
    while (kvp_hub_jobs(h->hub) > 0) {
        cr_assert_lt(kvp_now(), end, "jobs still running");
        uv_run(&h->loop, UV_RUN_NOWAIT);
        uv_sleep(1);
    }
}

char *ht_text(int words)
{
    static const char *w[] = {"Once", "upon", "a", "time", "there", "was", "a", "little",
                              "dog", "named", "Tom.", "He", "liked", "to", "run", "and",
                              "play", "in", "the", "park."};
    char *s = malloc((size_t)words * 8 + 1);
    size_t n = 0;
    for (int i = 0; i < words; i++)
        n += (size_t)sprintf(s + n, "%s%s", i ? " " : "", w[i % 20]);
    return s;
}
