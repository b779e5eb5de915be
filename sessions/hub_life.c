/* The daemon's side of the hub: start (the template, the workers, the background
 * queue), the policy of new sessions, the idle timeout, drain, stop and free. */
#include "sessions/hub.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "base/log.h"
#include "model/grammar.h"
#include "policy/kvp_agent.h"
#include "observe/background.h"
#include "sessions/hub_impl.h"
#include "store/prefix.h"
#include "sessions/prefix_load.h"
#include "sessions/residency.h"
#include "store/store.h"

/* ---- the daemon's side ---- */

/* chat_template_file: the Jinja template read and tried now, so a bad file stops the
 * start with the reason (where and which construct) instead of each turn. */
static int use_template_file(kvp_template *t, const char *path, char **kept, char *err,
                             size_t errlen)
{
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd < 0) {
        snprintf(err, errlen, "chat_template_file %s: %s", path,
                 fd == KVP_E_NOT_REGULAR ? "not a regular file" : strerror(-fd));
        return fd;
    }
    char *src = st.st_size <= (16 << 20) ? malloc((size_t)st.st_size + 1) : NULL;
    long long n = src ? kvp_read_full(fd, src, (size_t)st.st_size) : -EFBIG;
    close(fd);
    if (n < 0) {
        free(src);
        snprintf(err, errlen, "chat_template_file %s: %s", path,
                 n == -EFBIG ? "larger than 16 MiB" : strerror((int)-n));
        return (int)n;
    }
    char note[256];
    int rc = kvp_template_use_jinja(t, src, (size_t)n, note, sizeof note);
    if (rc >= 0 && !memchr(src, '\0', (size_t)n)) {   /* its text, for GET /props */
        src[n] = '\0';
        *kept = src;
    } else {
        free(src);
    }
    if (rc < 0)
        snprintf(err, errlen, "chat_template_file %s: %s", path, note);
    else
        kvpd_log("info", "chat template: %s (Jinja)", path);
    return rc;
}

int kvp_hub_start(kvp_hub **out, const kvp_hub_params *p, char *err, size_t errlen)
{
    kvp_hub *h = calloc(1, sizeof *h);
    *out = h;
    if (!h) {
        kvp_hub_storage_close(p->storage);
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    h->loop = p->loop;
    h->cfg = p->cfg;
    h->m = p->metrics;
    h->env.model = p->model;
    h->env.chunk = p->chunk;
    h->env.kv_type = p->kv_type;
    h->env.budget_mode = p->budget_mode;
    h->env.step_tokens = p->step_tokens;
    h->env.prefill_tokens = p->prefill_tokens;
    h->env.share_prompts = p->share_prompts;
    h->env.reuse_cache = p->reuse_cache;
    h->env.share_rows = p->share_rows;
    h->env.top_p = p->top_p;
    h->env.seed = p->seed;
    h->storage = p->storage;
    h->env.store = h->storage ? h->storage->store : NULL;
    h->env.state_dir = h->env.store ? kvp_store_dir(h->env.store) : "";
    h->workers = p->workers;
    h->pconf = kvp_policy_conf_ref(p->policy);
    h->row_bytes = kvp_cache_row_cost(p->kv_type, p->model->cfg.head_dim);
    char note[256];
    int rc = kvp_template_init(&h->env.tpl, p->model, p->chat_template, note, sizeof note);
    if (rc < 0) {
        snprintf(err, errlen, "%s", note);
        return rc;
    }
    if (rc > 0 && !(p->chat_template_file && p->chat_template_file[0]))
        kvpd_log("warning", "chat template: %s", note);
    if (p->chat_template_file && p->chat_template_file[0] &&
        (rc = use_template_file(&h->env.tpl, p->chat_template_file, &h->template_src, err, errlen)) < 0)
        return rc;
    /* raw text completions: the model's tokenizer, BOS first when it has one, no template */
    if ((rc = kvp_template_init(&h->env.tpl_raw, p->model, "plain", note, sizeof note)) < 0) {
        snprintf(err, errlen, "%s", note);
        return rc;
    }
    rc = kvp_session_table_init(&h->sessions);
    if (rc == 0 && h->storage) {
        h->transcripts = h->storage->transcripts;
        memset(&h->storage->transcripts, 0, sizeof h->storage->transcripts);
    } else if (rc == 0) {
        rc = kvp_transcripts_init(&h->transcripts);
    }
    if (rc < 0) {
        snprintf(err, errlen, "out of memory");
        return rc;
    }
    kvp_learnlog_cfg lc = {.dir = p->learn_dir, .rate = p->learn_rate,
                           .max_bytes = p->learn_max_bytes, .max_age_s = p->learn_max_age_s,
                           .fingerprint = p->model->cfg.fingerprint,
                           .exclude_system = p->learn_exclude_system};
    h->prefix = kvp_prefix_create(0, 0);   /* NULL: forks only by messages */
    if (h->storage && hub_prefix_adopt(h, &h->storage->prefix_recs) < 0)
        kvpd_log("warning", "prefix index: out of memory for the state directory's "
                 "conversations (they are fork sources once read again)");
    if (!(h->bg = kvp_background_new(p->model, p->kv_type, p->chunk, &lc, p->seed))) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    kvp_background_set_template(h->bg, &h->env.tpl);
    if ((rc = hub_resp_start(h, err, errlen)) < 0)
        return rc;
    rc = kvpd_sched_start(&h->sched, h->loop, p->workers, &h->env, kvp_turn_batch, hub_on_event,
                          h, err, errlen);
    if (rc == 0)
        kvpd_sched_set_idle(h->sched, &(kvpd_idle_ops){kvp_background_pending,
                                                        kvp_background_run, h->bg});
    return rc;
}

void kvp_hub_set_policy(kvp_hub *h, kvp_policy_conf *pc)
{
    kvp_policy_conf_unref(h->pconf);
    h->pconf = kvp_policy_conf_ref(pc);
}

/* A session whose snapshot write failed (a full or failing disk, Redis away or refusing
 * writes) is written again, 1 s after the failure, then 2, 4 ... up to 60 s apart, until
 * a write succeeds: the node recovers (/healthz, parking) once the store takes writes
 * again. With a shared store the write is fenced (store/store.h): it lands only under
 * this node's newest lease or a free one, over the version this copy descends from; a
 * copy another node has moved past comes back -ESTALE and is not retried again. */
static int retry_save(kvp_hub *h, kvp_session *s, double now)
{
    if (!s->save_failed || s->state != KVP_SESSION_IDLE || h->draining ||
        now < s->save_retry_at)
        return 0;
    int shift = s->save_retries < 6 ? s->save_retries : 6;
    double wait = (double)(1 << shift);
    s->save_retry_at = now + (wait > 60 ? 60 : wait);
    s->save_retries++;
    hub_submit(h, s, KVP_SESSION_SAVE, 0);
    return 1;
}

/* The store keeps the snapshots of sessions in memory or attached, whatever their age
 * (store/store.h): the set is given again at every sweep of the hub's. */
static void mark_live(kvp_hub *h)
{
    int n = 0;
    for (kvp_session *s = h->sessions.head; s; s = s->next)
        n++;
    const char **ids = n ? malloc((size_t)n * sizeof *ids) : NULL;
    if (n && !ids)
        return;   /* the previous set stays */
    int k = 0;
    for (kvp_session *s = h->sessions.head; s; s = s->next)
        if (s->state != KVP_SESSION_PARKED || s->client)
            ids[k++] = s->id;
    kvp_store_set_live(h->env.store, ids, k);
    free(ids);
}

void kvp_hub_expire(kvp_hub *h, double now)
{
    double timeout = h->cfg->idle_timeout_s;
    kvp_session *s = h->sessions.head;
    while (s) {
        kvp_session *next = s->next;
        double idle = now - s->last_active;
        if (kvp_session_busy(s) || retry_save(h, s, now)) {
            /* its job's end decides */
        } else if (!s->client && hub_never_used(s)) {
            kvp_hub_remove(h, s);
        } else if (h->env.store) {
            /* With a state directory nothing is dropped: idle sessions are parked (if
             * their snapshot is up to date), and parked ones nobody is attached to are
             * let go from memory after another timeout (open loads them again). */
            if (s->state == KVP_SESSION_IDLE && idle > timeout && kvp_session_parkable(s)) {
                kvp_hub_park(h, s);
            } else if (s->state == KVP_SESSION_PARKED && !s->client && idle > 2 * timeout) {
                h->m->sessions_forgotten++;
                hub_prefix_disk_keep(h, s);   /* still a fork source, read first */
                kvp_hub_remove(h, s);   /* its snapshot stays, and its index entry */
            }
        } else if (idle > timeout) {
            hub_emit_error(s->client, KVPD_E_UNKNOWN_SESSION,
                       "session expired after the idle timeout");
            h->m->sessions_expired++;
            kvp_hub_drop(h, s);
        }
        s = next;
    }
    if (h->env.store)
        mark_live(h);
}

int kvp_hub_drain(kvp_hub *h)
{
    h->draining = 1;
    hub_wait_drain(h);
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext)
        if (s->state == KVP_SESSION_TURN)
            atomic_store(&s->rq.cancel, 1);
    return h->jobs;
}

int kvp_hub_unsaved(const kvp_hub *h)
{
    /* Only resident sessions: one whose write failed is never parked. */
    int n = 0;
    for (const kvp_session *s = h->sessions.resident_head; s; s = s->rnext)
        n += s->save_failed;
    return n;
}

int kvp_hub_jobs(const kvp_hub *h)
{
    return h->jobs + hub_resp_pending(h);
}

int kvp_hub_learn_forget(kvp_hub *h, const char *tenant, int *deleted, char *err,
                         size_t errlen)
{
    *deleted = 0;
    if (!h->bg) {
        snprintf(err, errlen, "learn_dir is not set: no transcripts are kept");
        return -EOPNOTSUPP;
    }
    return kvp_background_forget(h->bg, tenant, deleted, err, errlen);
}

int kvp_hub_save_unsaved(kvp_hub *h)
{
    int n = 0;
    if (!h->env.store)
        return 0;
    /* (a hello's fork that has not run a turn holds only its source's history: nothing
     * of its own to keep, hub_never_used) */
    for (kvp_session *s = h->sessions.resident_head; s; s = s->rnext)
        if (s->state == KVP_SESSION_IDLE && !s->saved && (s->n_msgs > 0 || s->has_snapshot) &&
            !hub_never_used(s)) {
            hub_submit(h, s, KVP_SESSION_SAVE, 0);
            n++;
        }
    return n;
}

void kvp_hub_stop(kvp_hub *h)
{
    if (h && h->sched)
        kvpd_sched_stop(h->sched);
    if (h)
        hub_resp_stop(h);
}

void kvp_hub_free(kvp_hub *h)
{
    if (!h)
        return;
    if (h->sched)
        kvpd_sched_free(h->sched);
    /* Clients outlive the hub only in their front end's memory: cut their links. */
    for (kvp_session *s = h->sessions.head; s; s = s->next)
        if (s->client)
            s->client->session = NULL;
    hub_wait_free(h);
    hub_resp_free(h);
    kvp_session_table_clear(&h->sessions);
    kvp_transcripts_free(&h->transcripts);
    kvp_background_free(h->bg);
    kvp_prefix_free(h->prefix);
    hub_prefix_disk_free(h);
    kvp_policy_conf_unref(h->pconf);
    kvp_hub_storage_close(h->storage);
    kvp_template_free(&h->env.tpl);
    kvp_template_free(&h->env.tpl_raw);
    free(h->template_src);
    if (h->trie) {
        kvp_vocab_trie_free(h->trie);
        free(h->trie);
    }
    free(h);
}
