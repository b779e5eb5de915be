/* Stored responses through the hub (sessions/hub.h, kvp_hub_response_*): the front end
 * hands a record's bytes or names one, and the hub keeps it in the store that keeps the
 * sessions (store/responses.h: the state directory, Redis, or memory without a store).
 * The store's calls block, so they run on a thread of the hub's own, one at a time in
 * the order asked, never on the loop and never inside a batched step (nor holding a
 * worker a step needs). Answers come back to the loop through a uv_async and go to the
 * client that asked, as a KVP_HUB_RESPONSE event; a client closed meanwhile gets
 * nothing (its write still lands). The daemon's drain waits for them (kvp_hub_jobs). */
#include "sessions/hub.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

#include "base/log.h"
#include "base/thread.h"
#include "sessions/hub_impl.h"
#include "store/responses.h"

enum { OP_PUT, OP_GET, OP_DELETE };

typedef struct resp_op {
    struct resp_op *next;         /* loop: every op not answered yet */
    struct resp_op *qnext;        /* the thread's queue, then the answered list */
    kvp_hub_client *c;            /* loop: NULL once the client closed */
    int kind;
    char tenant[KVP_TENANT_LEN + 1];
    char id[KVP_RESP_ID_LEN + 1];
    char *data;                   /* PUT: the payload; GET: the payload read */
    size_t len;
    int max_count;
    uint64_t max_bytes;
    int rc;
    char msg[600];
} resp_op;

struct hub_resp {
    kvp_resp_store *rs;
    int own;                      /* rs is the hub's (no storage) */
    pthread_t thread;
    int thread_on;
    pthread_mutex_t mu;
    pthread_cond_t wake;
    resp_op *q_head, *q_tail;     /* for the thread */
    resp_op *d_head, *d_tail;     /* answered, for the loop */
    int stopping;
    uv_async_t async;
    int async_on;
    resp_op *all;                 /* loop */
    int pending;                  /* loop: ops not answered yet */
};

static void push(resp_op **head, resp_op **tail, resp_op *op)
{
    op->qnext = NULL;
    if (*tail)
        (*tail)->qnext = op;
    else
        *head = op;
    *tail = op;
}

static void run(struct hub_resp *r, resp_op *op)
{
    char err[sizeof op->msg] = "";
    int dropped = 0;
    switch (op->kind) {
    case OP_PUT:
        op->rc = kvp_resp_put(r->rs, op->tenant, op->id, op->data, op->len, op->max_count,
                              op->max_bytes, &dropped, err, sizeof err);
        free(op->data);
        op->data = NULL;
        break;
    case OP_GET:
        op->rc = kvp_resp_get(r->rs, op->tenant, op->id, &op->data, &op->len, err, sizeof err);
        break;
    default:
        op->rc = kvp_resp_remove(r->rs, op->tenant, op->id, err, sizeof err);
        break;
    }
    if (op->rc == -EBADMSG) {   /* refused, logged, answered as none */
        kvpd_log("warning", "%s", err);
        op->rc = -ENOENT;
        snprintf(op->msg, sizeof op->msg, "the stored response is damaged");
    } else if (op->rc < 0 && op->rc != -ENOENT) {
        kvpd_log("warning", "stored response %s: %s", op->id, err);
        snprintf(op->msg, sizeof op->msg, "%s", err);
    }
}

static void *thread_main(void *arg)
{
    struct hub_resp *r = arg;
    kvp_thread_name("kvpd-responses");
    pthread_mutex_lock(&r->mu);
    for (;;) {
        while (!r->q_head && !r->stopping)
            pthread_cond_wait(&r->wake, &r->mu);
        if (!r->q_head)
            break;
        resp_op *op = r->q_head;
        if (!(r->q_head = op->qnext))
            r->q_tail = NULL;
        pthread_mutex_unlock(&r->mu);
        run(r, op);
        pthread_mutex_lock(&r->mu);
        push(&r->d_head, &r->d_tail, op);
        uv_async_send(&r->async);
        if (r->stopping)
            break;
    }
    pthread_mutex_unlock(&r->mu);
    return NULL;
}

static void op_free(resp_op *op)
{
    free(op->data);
    free(op);
}

/* Loop: the answered ops to their clients. */
static void on_async(uv_async_t *a)
{
    kvp_hub *h = a->data;
    struct hub_resp *r = h->resp;
    pthread_mutex_lock(&r->mu);
    resp_op *list = r->d_head;
    r->d_head = r->d_tail = NULL;
    pthread_mutex_unlock(&r->mu);
    while (list) {
        resp_op *op = list;
        list = op->qnext;
        for (resp_op **at = &r->all; *at; at = &(*at)->next)
            if (*at == op) {
                *at = op->next;
                break;
            }
        r->pending--;
        if (op->c) {
            kvp_hub_event ev = {.type = KVP_HUB_RESPONSE, .id = op->id, .resp_rc = op->rc};
            if (op->rc == 0 && op->kind == OP_GET) {
                ev.text = op->data;
                ev.len = op->len;
            } else {
                ev.text = op->msg;
                ev.len = strlen(op->msg);
            }
            op->c->sink(op->c->ctx, &ev);
        }
        op_free(op);
    }
}

int hub_resp_start(kvp_hub *h, char *err, size_t errlen)
{
    struct hub_resp *r = calloc(1, sizeof *r);
    if (!r) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    h->resp = r;
    r->rs = h->storage ? h->storage->resp : NULL;
    if (!r->rs) {
        int rc = kvp_resp_open(&r->rs, NULL, err, errlen);
        if (rc < 0)
            return rc;
        r->own = 1;
    }
    pthread_mutex_init(&r->mu, NULL);
    pthread_cond_init(&r->wake, NULL);
    r->async.data = h;
    if (uv_async_init(h->loop, &r->async, on_async) < 0) {
        snprintf(err, errlen, "stored responses: uv_async_init failed");
        return -ENOMEM;
    }
    r->async_on = 1;
    if (pthread_create(&r->thread, NULL, thread_main, r) != 0) {
        snprintf(err, errlen, "stored responses: cannot start a thread");
        return -EAGAIN;
    }
    r->thread_on = 1;
    return 0;
}

void hub_resp_stop(kvp_hub *h)
{
    struct hub_resp *r = h->resp;
    if (!r)
        return;
    if (r->thread_on) {
        pthread_mutex_lock(&r->mu);
        r->stopping = 1;
        pthread_cond_signal(&r->wake);
        pthread_mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
        r->thread_on = 0;
    }
    if (r->async_on) {
        uv_close((uv_handle_t *)&r->async, NULL);
        r->async_on = 0;
    }
}

void hub_resp_free(kvp_hub *h)
{
    struct hub_resp *r = h->resp;
    if (!r)
        return;
    hub_resp_stop(h);
    for (resp_op *op = r->all, *n; op; op = n) {   /* queued or answered, never sent */
        n = op->next;
        op_free(op);
    }
    if (r->own)
        kvp_resp_close(r->rs);
    pthread_mutex_destroy(&r->mu);
    pthread_cond_destroy(&r->wake);
    free(r);
    h->resp = NULL;
}

int hub_resp_pending(const kvp_hub *h)
{
    return h->resp ? h->resp->pending : 0;
}

void hub_resp_leave(kvp_hub_client *c)
{
    struct hub_resp *r = c->hub->resp;
    for (resp_op *op = r ? r->all : NULL; op; op = op->next)
        if (op->c == c)
            op->c = NULL;
}

/* Queues an op for the thread, or answers it at once (through the same async) when the
 * id is none kvpd makes. */
static void submit(kvp_hub_client *c, int kind, const char *id, const char *data, size_t len)
{
    kvp_hub *h = c->hub;
    struct hub_resp *r = h->resp;
    resp_op *op = calloc(1, sizeof *op);
    if (!op || (kind == OP_PUT && !(op->data = malloc(len ? len : 1)))) {
        free(op);
        hub_emit_error(c, KVPD_E_INTERNAL, "out of memory");
        return;
    }
    op->c = c;
    op->kind = kind;
    snprintf(op->tenant, sizeof op->tenant, "%s", c->tenant);
    int ok = kvp_resp_id_ok(id);
    snprintf(op->id, sizeof op->id, "%s", ok ? id : "");
    if (kind == OP_PUT) {
        memcpy(op->data, data, len);
        op->len = len;
        op->max_count = h->cfg->max_stored_responses_per_tenant;
        op->max_bytes = h->cfg->max_stored_response_bytes_per_tenant;
    }
    op->next = r->all;
    r->all = op;
    r->pending++;
    pthread_mutex_lock(&r->mu);
    if (ok) {
        push(&r->q_head, &r->q_tail, op);
        pthread_cond_signal(&r->wake);
    } else {
        op->rc = -EINVAL;
        snprintf(op->msg, sizeof op->msg, "not a response id: they are %s and %d hex digits",
                 KVP_RESP_ID_PREFIX, KVP_RESP_ID_HEX);
        push(&r->d_head, &r->d_tail, op);
        uv_async_send(&r->async);
    }
    pthread_mutex_unlock(&r->mu);
}

void kvp_hub_response_put(kvp_hub_client *c, const char *id, const char *payload, size_t len)
{
    submit(c, OP_PUT, id, payload, len);
}

void kvp_hub_response_get(kvp_hub_client *c, const char *id)
{
    submit(c, OP_GET, id, NULL, 0);
}

void kvp_hub_response_delete(kvp_hub_client *c, const char *id)
{
    submit(c, OP_DELETE, id, NULL, 0);
}
