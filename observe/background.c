/* Background work on an idle worker: canary reference runs and transcript writes
 * (background.h). One mutex guards the queue and the results; the run itself holds it
 * only to take its item and to leave its result. A second one serializes the files of
 * learn_dir: a transcript's write, and a tenant's transcripts deleted from the loop. */
#include "observe/background.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/log.h"
#include "base/rng.h"
#include "base/textbuf.h"
#include "model/forward.h"
#include "model/template.h"

typedef struct item {
    kvp_canary_rec *canary;          /* or a transcript: */
    char id[64];
    char tenant[72];
    int *tokens;
    int n;
    char *system;                    /* with exclude_system: the system prompt (NULL: none) */
    size_t system_len;
    char *first;                     /* ... and the conversation's first message */
    size_t first_len;
    int first_user;
    struct item *next;
} item;

typedef struct result {
    char policy[32];
    int budget;
    int rc;                          /* 0, KVP_CANARY_YIELDED, < 0 */
    int transcript;                  /* a transcript write (rc its outcome) */
    kvp_canary_result r;
    char err[160];
} result;

#define RESULTS_MAX 64

struct kvp_background {
    const kvp_model *model;
    kvp_kv_type kv_type;
    int chunk;
    kvp_learnlog_cfg log;
    char log_dir[1024];
    const kvp_template *tpl;         /* renders the first message for exclude_system */
    uint64_t rng;                    /* loop only */
    pthread_mutex_t mu;
    pthread_mutex_t files_mu;        /* learn_dir's files: one write or one deletion */
    char writing[72];                /* mu: the tenant of the transcript being written */
    int writing_cancelled;           /* mu: its tenant's transcripts were deleted meanwhile */
    int writing_on;
    item *head, *tail;
    int queued, queued_canaries;
    uint64_t dropped;                /* queued past KVP_BACKGROUND_MAX */
    result results[RESULTS_MAX];
    int n_results;
    uint64_t results_lost;
    kvp_runstate rs;                 /* the reference runs' (one runs at a time) */
    int rs_ready;
};

kvp_background *kvp_background_new(const kvp_model *model, kvp_kv_type kv_type, int chunk,
                                   const kvp_learnlog_cfg *log, uint64_t seed)
{
    kvp_background *b = calloc(1, sizeof *b);
    if (!b)
        return NULL;
    b->model = model;
    b->kv_type = kv_type;
    b->chunk = chunk > 0 ? chunk : 32;
    if (log)
        b->log = *log;
    snprintf(b->log_dir, sizeof b->log_dir, "%s", log && log->dir ? log->dir : "");
    b->log.dir = b->log_dir;
    b->rng = seed ^ 0x63616e617279ULL;
    pthread_mutex_init(&b->mu, NULL);
    pthread_mutex_init(&b->files_mu, NULL);
    return b;
}

void kvp_background_set_template(kvp_background *b, const kvp_template *tpl)
{
    b->tpl = tpl;
}

static void item_free(item *it)
{
    kvp_canary_rec_free(it->canary);
    free(it->tokens);
    free(it->system);
    free(it->first);
    free(it);
}

void kvp_background_free(kvp_background *b)
{
    if (!b)
        return;
    while (b->head) {
        item *it = b->head;
        b->head = it->next;
        item_free(it);
    }
    if (b->rs_ready)
        kvp_runstate_free(&b->rs);
    pthread_mutex_destroy(&b->mu);
    pthread_mutex_destroy(&b->files_mu);
    free(b);
}

const kvp_learnlog_cfg *kvp_background_learnlog(const kvp_background *b)
{
    return &b->log;
}

int kvp_background_sample(kvp_background *b, double rate)
{
    if (!b || rate <= 0.0)
        return 0;
    double u = (double)(kvp_splitmix64(&b->rng) >> 11) * (1.0 / 9007199254740992.0);
    return u < rate;
}

/* Queues an item. A conversation's transcript waiting already is replaced by its newer
 * one (the file holds the whole conversation); canaries past KVP_BACKGROUND_MAX waiting,
 * and transcripts past KVP_BACKGROUND_MAX_TRANSCRIPTS, are dropped. */
static void enqueue(kvp_background *b, item *it)
{
    pthread_mutex_lock(&b->mu);
    if (!it->canary)
        for (item *q = b->head; q; q = q->next)
            if (!q->canary && !strcmp(q->id, it->id)) {
                free(q->tokens);
                q->tokens = it->tokens;
                q->n = it->n;
                it->tokens = NULL;
                /* the same conversation: the same system prompt and first message */
                pthread_mutex_unlock(&b->mu);
                item_free(it);
                return;
            }
    int full = it->canary ? b->queued_canaries >= KVP_BACKGROUND_MAX
                          : b->queued - b->queued_canaries >= KVP_BACKGROUND_MAX_TRANSCRIPTS;
    if (full) {
        b->dropped++;
        pthread_mutex_unlock(&b->mu);
        item_free(it);
        return;
    }
    *(b->tail ? &b->tail->next : &b->head) = it;
    b->tail = it;
    b->queued++;
    b->queued_canaries += it->canary != NULL;
    pthread_mutex_unlock(&b->mu);
}

void kvp_background_canary(kvp_background *b, kvp_canary_rec *r)
{
    if (!r)
        return;
    item *it = r->unusable || r->n_pos == 0 ? NULL : calloc(1, sizeof *it);
    if (!it) {
        kvp_canary_rec_free(r);
        return;
    }
    it->canary = r;
    enqueue(b, it);
}

void kvp_background_transcript(kvp_background *b, const kvp_background_conv *conv)
{
    int n = conv->n;
    item *it = n > 0 ? calloc(1, sizeof *it) : NULL;
    if (!it || !(it->tokens = malloc((size_t)n * sizeof *it->tokens))) {
        free(it);
        return;
    }
    memcpy(it->tokens, conv->tokens, (size_t)n * sizeof *conv->tokens);
    it->n = n;
    snprintf(it->id, sizeof it->id, "%s", conv->session_id);
    snprintf(it->tenant, sizeof it->tenant, "%s", conv->tenant ? conv->tenant : "");
    if (b->log.exclude_system && conv->system_len > 0) {
        /* the span is found on the worker, from the system prompt and the first message */
        it->system = kvp_text_dup(conv->system, conv->system_len);
        it->system_len = conv->system_len;
        it->first = kvp_text_dup(conv->first ? conv->first : "", conv->first_len);
        it->first_len = conv->first_len;
        it->first_user = conv->first_user;
        if (!it->system || !it->first) {
            item_free(it);
            return;
        }
    }
    enqueue(b, it);
}

/* exclude_system: the item's tokens without the system prompt's. 0, or -ENOENT (the
 * span was not found: nothing may be written) with why in err. */
static int strip_system(const kvp_background *b, item *it, char *err, size_t errlen)
{
    if (!it->system)
        return 0;
    int *with = NULL, *without = NULL, nw = -EINVAL, no = -EINVAL, rc = -ENOENT;
    kvp_chat_msg m = {.user = it->first_user, .text = it->first, .len = it->first_len};
    if (b->tpl) {
        nw = kvp_template_render(b->tpl, it->system, it->system_len, &m, 1, &with);
        no = kvp_template_render(b->tpl, NULL, 0, &m, 1, &without);
    }
    if (nw > 0 && no >= 0) {
        int n = kvp_learnlog_strip_system(it->tokens, it->n, with, nw, without, no);
        if (n >= 0) {
            it->n = n;
            rc = 0;
        }
    }
    free(with);
    free(without);
    if (rc < 0)
        snprintf(err, errlen, "learn_exclude_system: the system prompt's tokens were not found "
                 "in a conversation's transcript, which is not kept");
    return rc;
}

/* The transcript's file: not written when its tenant's transcripts were deleted since
 * the item left the queue (the deletion waits for a write under way, then removes it). */
static int write_transcript(kvp_background *b, item *it, char *err, size_t errlen)
{
    int rc = strip_system(b, it, err, errlen);
    if (rc < 0)
        return rc;
    pthread_mutex_lock(&b->files_mu);
    pthread_mutex_lock(&b->mu);
    int cancelled = b->writing_cancelled;
    pthread_mutex_unlock(&b->mu);
    if (!cancelled)
        rc = kvp_learnlog_write(&b->log, it->tenant, it->id, it->tokens, it->n, err, errlen);
    pthread_mutex_unlock(&b->files_mu);
    return rc;
}

int kvp_background_forget(kvp_background *b, const char *tenant, int *deleted, char *err,
                          size_t errlen)
{
    *deleted = 0;
    if (!b->log.dir[0]) {
        snprintf(err, errlen, "learn_dir is not set: no transcripts are kept");
        return -EOPNOTSUPP;
    }
    pthread_mutex_lock(&b->mu);
    for (item **at = &b->head; *at;) {
        item *q = *at;
        if (q->canary || strcmp(q->tenant, tenant)) {
            at = &q->next;
            continue;
        }
        *at = q->next;
        b->queued--;
        item_free(q);
    }
    b->tail = NULL;
    for (item *q = b->head; q; q = q->next)
        b->tail = q;
    if (b->writing_on && !strcmp(b->writing, tenant))
        b->writing_cancelled = 1;
    pthread_mutex_unlock(&b->mu);
    pthread_mutex_lock(&b->files_mu);
    int rc = kvp_learnlog_forget(&b->log, tenant, deleted, err, errlen);
    pthread_mutex_unlock(&b->files_mu);
    return rc;
}

int kvp_background_pending(void *arg)
{
    kvp_background *b = arg;
    pthread_mutex_lock(&b->mu);
    int n = b->queued;
    pthread_mutex_unlock(&b->mu);
    return n > 0;
}

static void put_result(kvp_background *b, const result *r)
{
    pthread_mutex_lock(&b->mu);
    if (b->n_results < RESULTS_MAX)
        b->results[b->n_results++] = *r;
    else
        b->results_lost++;
    pthread_mutex_unlock(&b->mu);
}

void kvp_background_run(void *arg, int (*busy)(void *), void *ctx)
{
    kvp_background *b = arg;
    pthread_mutex_lock(&b->mu);
    item *it = b->head;
    if (it) {
        b->head = it->next;
        if (!b->head)
            b->tail = NULL;
        b->queued--;
        b->queued_canaries -= it->canary != NULL;
        if (!it->canary) {
            snprintf(b->writing, sizeof b->writing, "%s", it->tenant);
            b->writing_on = 1;
            b->writing_cancelled = 0;
        }
    }
    pthread_mutex_unlock(&b->mu);
    if (!it)
        return;
    result res = {0};
    if (!it->canary) {
        res.transcript = 1;
        res.rc = write_transcript(b, it, res.err, sizeof res.err);
        pthread_mutex_lock(&b->mu);
        b->writing_on = 0;
        pthread_mutex_unlock(&b->mu);
    } else {
        snprintf(res.policy, sizeof res.policy, "%s", it->canary->policy);
        res.budget = it->canary->budget;
        if (!b->rs_ready) {
            int rc = kvp_runstate_init(&b->rs, &b->model->cfg, b->chunk);
            b->rs_ready = rc == 0;
            if (rc < 0) {
                res.rc = rc;
                snprintf(res.err, sizeof res.err, "runstate: %s", strerror(-rc));
            }
        }
        if (b->rs_ready)
            res.rc = kvp_canary_run(b->model, &b->rs, b->kv_type, b->chunk, it->canary, busy,
                                    ctx, &res.r, res.err, sizeof res.err);
    }
    item_free(it);
    put_result(b, &res);
}

void kvp_background_drain(kvp_background *b, kvpd_metrics *m)
{
    if (!b)
        return;
    result got[RESULTS_MAX];
    pthread_mutex_lock(&b->mu);
    int n = b->n_results;
    memcpy(got, b->results, (size_t)n * sizeof *got);
    b->n_results = 0;
    m->canary.dropped = b->dropped;
    m->canary.dropped += b->results_lost;
    pthread_mutex_unlock(&b->mu);
    for (int i = 0; i < n; i++) {
        const result *r = &got[i];
        if (r->transcript) {
            if (r->rc == 0) {
                m->canary.transcripts_written++;
            } else {
                m->canary.transcript_failures++;
                kvpd_log("warning", "learn_dir: %s", r->err);
            }
        } else if (r->rc == KVP_CANARY_YIELDED) {
            m->canary.skipped_busy++;
        } else if (r->rc < 0) {
            m->canary.failed++;
            if (r->rc != -E2BIG)
                kvpd_log("warning", "eviction canary: %s", r->err);
        } else {
            kvpd_canary_observe(m, r->policy, r->budget, r->r.kl, r->r.top1);
        }
    }
}
