/* Session <-> snapshot. The snapshot module validates the file; this one decides whether
 * the cache in it can be used by the running daemon, and rebuilds from the transcript
 * when it cannot. */
#include "turns/persist.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/clock.h"
#include "base/log.h"
#include "store/store.h"
#include "store/prefix_file.h"
#include "store/transcripts.h"

/* The snapshot's messages borrow the session's (the write only reads them). */
static int borrow_msgs(const kvp_session *s, int from, kvp_snapshot_msg **out)
{
    int n = s->n_msgs - from;
    *out = NULL;
    if (n <= 0)
        return 0;
    if (!(*out = malloc((size_t)n * sizeof **out)))
        return -ENOMEM;
    for (int i = 0; i < n; i++)
        (*out)[i] = (kvp_snapshot_msg){s->msgs[from + i].user, s->msgs[from + i].text,
                                       s->msgs[from + i].len,
                                       s->hist_tokens + s->msg_tok[from + i]};
    return n;
}

static int save_full(kvp_session *s, const kvp_session_env *env, void *cache, size_t cache_len,
                     size_t *bytes, char *err, size_t errlen)
{
    kvp_snapshot snap;
    memset(&snap, 0, sizeof snap);
    snprintf(snap.id, sizeof snap.id, "%s", s->id);
    snap.ident = s->pconf->ident;
    snap.budget = s->rq.spec.budget;
    snap.turns = s->turns_done;
    snap.evicted_rows = s->cache.evicted_rows;
    snap.created = s->created_wall;
    snap.last_active = kvp_wall_now();
    snap.tokens = s->tokens;
    snap.n_tokens = s->n_tokens;
    snap.n_cached = s->n_cached;
    snap.hist_msgs = s->hist_msgs;
    snap.hist_tokens = s->hist_tokens;
    snap.hist_hash = s->hist_hash;
    snap.system = s->system;
    snap.system_len = s->system_len;
    snprintf(snap.tenant, sizeof snap.tenant, "%s", s->tenant);
    snap.cache = cache;
    snap.cache_len = cache_len;
    int rc = borrow_msgs(s, 0, &snap.msgs);
    if (rc < 0) {
        snprintf(err, errlen, "snapshot %s: out of memory", s->id);
        return rc;
    }
    snap.n_msgs = rc;
    uint64_t version = s->store_version;
    rc = s->save_leased ? kvp_store_put_leased(env->store, &snap, &version, bytes, err, errlen)
                        : kvp_store_put(env->store, &snap, &version, bytes, err, errlen);
    if (rc == 0) {
        s->store_version = version;
        s->journal_ok = 1;
        s->journal_bytes = 0;
        s->base_bytes = cache_len + 4 * (size_t)s->n_tokens;
        for (int i = 0; i < s->n_msgs; i++)
            s->base_bytes += s->msgs[i].len;
    }
    free(snap.msgs);
    return rc;
}

/* What is on disk ends at message journal_msgs and token journal_tokens of the whole
 * conversation: their places in msgs[] and tokens[]. */
static int new_msgs_from(const kvp_session *s) { return s->journal_msgs - s->hist_msgs; }
static int64_t new_tokens_from(const kvp_session *s) { return s->journal_tokens - s->hist_tokens; }

static int save_increment(kvp_session *s, void *cache, size_t cache_len,
                          const kvp_session_env *env, size_t *bytes, char *err, size_t errlen)
{
    int tf = (int)new_tokens_from(s);
    kvp_journal_rec rec = {
        .turns = s->turns_done, .evicted_rows = s->cache.evicted_rows,
        .last_active = kvp_wall_now(), .msgs_before = s->journal_msgs,
        .tokens_before = s->journal_tokens, .tokens = s->tokens + tf,
        .n_tokens = s->n_tokens - tf, .n_cached = s->n_cached,
        .hist_msgs = s->hist_msgs, .hist_tokens = s->hist_tokens, .hist_hash = s->hist_hash,
        .cache = cache, .cache_len = cache_len};
    kvp_snapshot_msg *msgs;
    int rc = borrow_msgs(s, new_msgs_from(s), &msgs);
    if (rc < 0) {
        snprintf(err, errlen, "journal %s: out of memory", s->id);
        return rc;
    }
    rec.msgs = msgs;
    rec.n_msgs = rc;
    rc = kvp_store_append(env->store, s->id, &rec, &s->journal_bytes, bytes, err, errlen);
    free(msgs);
    if (rc < 0)
        s->journal_ok = 0;   /* maybe a torn record: the next save rewrites everything */
    return rc;
}

/* The conversation's token blocks for the prefix index of a restart (prefix_file.h), in
 * the state directory's file or beside its snapshot in Redis: its chain hashes while its
 * cache holds its tokens from the start (as the hub indexes it), else a line of no blocks
 * that retires the earlier ones. */
static void save_prefix(const kvp_session *s, const kvp_session_env *env)
{
    int whole = s->policy && !s->hist_tokens && s->cache.n_seen == s->n_cached &&
                s->n_cached > 0 && s->n_cached <= s->n_tokens;
    int max = whole ? s->n_cached / KVP_PREFIX_BLOCK : 0;
    if (max > KVP_PREFIX_MAX_PER)
        max = KVP_PREFIX_MAX_PER;
    uint64_t *chain = max ? malloc((size_t)max * sizeof *chain) : NULL;
    int n = chain ? kvp_prefix_chain(s->tenant, s->tokens, s->n_cached, chain, max) : 0;
    char err[256];
    int rc = env->state_dir && env->state_dir[0]
                 ? kvp_prefix_file_append(env->state_dir, s->id, s->tenant, chain, n, err,
                                          sizeof err)
                 : kvp_prefix_store_put(env->store, s->id, s->tenant, chain, n, err, sizeof err);
    if (rc < 0)
        kvpd_log("warning", "session %.8s: %s (after a restart, this conversation is no "
                 "source of forks until it is read again)", s->id, err);
    free(chain);
}

int kvp_session_save(kvp_session *s, const kvp_session_env *env, char *err, size_t errlen)
{
    double t0 = kvp_now();
    s->res.save_bytes = 0;
    void *cache;
    size_t cache_len;
    int rc = kvp_cache_serialize(&s->cache, &cache, &cache_len);
    if (rc < 0) {
        snprintf(err, errlen, "snapshot %s: serializing the cache: %s", s->id, strerror(-rc));
        return rc;
    }
    size_t limit = s->base_bytes > KVP_JOURNAL_MIN_BYTES ? s->base_bytes : KVP_JOURNAL_MIN_BYTES;
    /* A record extends what is on disk: the transcript must still hold its end. */
    int full = !kvp_store_has_journal(env->store) || !s->journal_ok || new_msgs_from(s) < 0 || new_msgs_from(s) > s->n_msgs ||
               new_tokens_from(s) < 0 || new_tokens_from(s) > s->n_tokens ||
               s->journal_bytes > limit;
    rc = full ? save_full(s, env, cache, cache_len, &s->res.save_bytes, err, errlen)
              : save_increment(s, cache, cache_len, env, &s->res.save_bytes, err, errlen);
    s->res.save_ms = (kvp_now() - t0) * 1e3;
    if (rc == 0) {
        s->journal_msgs = s->hist_msgs + s->n_msgs;
        s->journal_tokens = s->hist_tokens + s->n_tokens;
    }
    /* The conversation can be found by its transcript after a restart (the whole of it:
     * the hash and count cover the dropped messages too); the index is the directory's. */
    if (rc == 0 && env->state_dir && env->state_dir[0]) {
        char ierr[256];
        if (kvp_transcripts_append(env->state_dir, s->id, kvp_session_index_hash(s),
                                   s->hist_msgs + s->n_msgs, ierr, sizeof ierr) < 0)
            kvpd_log("warning", "session %.8s: %s (after a restart, a request extending this "
                     "conversation would start a new one)", s->id, ierr);
    }
    if (rc == 0 && env->store)
        save_prefix(s, env);
    free(cache);
    return rc;
}

static int append(kvp_session *s, const int *ids, int n)
{
    if (n <= 0)   /* a message of no tokens: ids may be NULL, as tokens may be */
        return 0;
    if (s->n_tokens + n > s->cap_tokens) {
        int cap = s->cap_tokens ? s->cap_tokens : 256;
        while (cap < s->n_tokens + n)
            cap *= 2;
        int *v = realloc(s->tokens, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        s->tokens = v;
        s->cap_tokens = cap;
    }
    memcpy(s->tokens + s->n_tokens, ids, (size_t)n * sizeof *ids);
    s->n_tokens += n;
    return 0;
}

/* Renders the messages with the chat template as the turns would have: each message's
 * first token into msg_tok, and with `keep` the ids into tokens (else only counted, for
 * a transcript whose ids are kept as they are). */
static int render(kvp_session *s, const kvp_session_env *env, int keep)
{
    int count = 0;
    if (keep)
        s->n_tokens = 0;
    for (int i = 0; i < s->n_msgs; i++) {
        const kvp_message *m = &s->msgs[i];
        int *ids = NULL;
        /* A chat format's end marker goes before each later user message (reply_open),
         * whether the reply ended with it or was cut: the same tokens either way. */
        const kvp_template *tpl = kvp_session_tpl(s, env);
        int n = m->user ? kvp_template_turn(tpl, s->system, s->system_len, count == 0,
                                            i > 0, m->text, m->len, &ids)
                        : kvp_template_reply(tpl, m->text, m->len, &ids);
        if (n < 0)
            return n;
        s->msg_tok[i] = keep || count <= s->n_tokens ? count : s->n_tokens;
        int rc = keep ? append(s, ids, n) : 0;
        free(ids);
        if (rc < 0)
            return rc;
        count += n;
    }
    return 0;
}

void kvp_session_forget(kvp_session *s)
{
    kvp_cache_reset(&s->cache);
    if (s->policy)
        kvp_policy_destroy(s->policy);
    s->policy = NULL;
    kvp_session_clear_transcript(s);
    s->n_cached = 0;
    s->hist_msgs = 0;
    s->hist_tokens = 0;
    s->reply_open = 0;
}

int kvp_session_retokenize(kvp_session *s, const kvp_session_env *env)
{
    s->jinja_rendered = 0;   /* the family's tokens: the next Jinja turn compares them */
    return render(s, env, 1);
}

/* Why the snapshot's cache cannot be used as it is, or NULL. */
static const char *cache_unusable(const kvp_snapshot *snap, const kvp_cache *c,
                                  const kvp_model_config *cfg, size_t max_bytes)
{
    if (c->n_layers != cfg->n_layers || c->n_kv_heads != cfg->n_kv_heads ||
        c->head_dim != cfg->head_dim || !kvp_rope_same(&c->rope, &cfg->rope))
        return "its cache has another shape";
    if (c->n_seen != snap->hist_tokens + snap->n_cached)
        return "its cache does not match its transcript";
    if (max_bytes && kvp_cache_bytes(c) > max_bytes)
        return "its cache is larger than a turn may hold now";
    return NULL;
}

int kvp_session_restore(kvp_session *s, const kvp_session_env *env, size_t max_bytes,
                        char *err, size_t errlen)
{
    kvp_snapshot snap;
    /* With the turns since the snapshot (the journal). A damaged tail costs those turns,
     * not the session. */
    size_t journal_bytes;
    char jerr[256];
    int journal_clean;
    uint64_t version;
    int rc = kvp_store_get(env->store, s->id, &snap, &version, &journal_bytes, &journal_clean, jerr,
                           sizeof jerr, err, errlen);
    if (rc < 0)
        return rc;
    const kvp_model_config *cfg = &env->model->cfg;
    kvp_restored *r = &s->res.restored;
    memset(r, 0, sizeof *r);

    snprintf(r->tenant, sizeof r->tenant, "%s", snap.tenant);
    /* The system text and the messages: their texts move over from the snapshot. */
    free(s->system);
    s->system = snap.system;
    s->system_len = snap.system_len;
    snap.system = NULL;
    int firsts_known = 1;
    if (snap.n_msgs) {
        s->msgs = calloc((size_t)snap.n_msgs, sizeof *s->msgs);
        s->msg_tok = calloc((size_t)snap.n_msgs, sizeof *s->msg_tok);
        if (!s->msgs || !s->msg_tok) {
            kvp_session_clear_transcript(s);
            kvp_snapshot_free(&snap);
            snprintf(err, errlen, "restoring %s: out of memory", s->id);
            return -ENOMEM;
        }
        s->cap_msgs = snap.n_msgs;
        for (int i = 0; i < snap.n_msgs; i++) {
            s->msgs[i] = (kvp_message){snap.msgs[i].user, snap.msgs[i].text, snap.msgs[i].len};
            snap.msgs[i].text = NULL;
            s->msg_tok[i] = (int)(snap.msgs[i].first_token - snap.hist_tokens);
            firsts_known &= snap.msgs[i].first_token >= 0;
        }
        s->n_msgs = snap.n_msgs;
    }
    s->hist_msgs = snap.hist_msgs;
    s->hist_hash = snap.hist_hash;
    s->hist_tokens = snap.hist_tokens;

    const kvp_snapshot_identity *want = &s->pconf->ident;
    int same_model = snap.ident.model_hash == want->model_hash &&
                     !strcmp(snap.ident.model_name, want->model_name);
    for (int i = 0; same_model && i < snap.n_tokens; i++)
        if (snap.tokens[i] >= cfg->vocab_size)
            same_model = 0;
    const char *why = NULL;
    kvp_cache c;
    char cerr[160];
    int have_cache = 0;
    if (!same_model) {
        why = "it was made with another model";
    } else if (!kvp_snapshot_identity_equal(&snap.ident, want)) {
        why = "it was made with another policy";
    } else if (kvp_cache_deserialize(&c, snap.cache, snap.cache_len, cerr, sizeof cerr) < 0) {
        why = "its cache does not decode";
    } else if (kvp_cache_convert(&c, env->kv_type) < 0) {
        /* rows of another kv_type are re-encoded as this daemon stores them */
        why = "its cache could not be converted to this kv_type";
        kvp_cache_free(&c);
    } else if ((why = cache_unusable(&snap, &c, cfg, max_bytes))) {
        kvp_cache_free(&c);
    } else {
        have_cache = 1;
    }

    /* Rebuilt after history was dropped: the kept tokens do not start a conversation, so
     * the kept messages are rendered as one (a new token stream for the new cache). */
    int restart = !same_model || (!have_cache && snap.hist_tokens > 0);
    if (!restart) {   /* the ids are this model's own: keep them exactly */
        free(s->tokens);
        s->tokens = snap.tokens;
        s->n_tokens = s->cap_tokens = snap.n_tokens;
        snap.tokens = NULL;
        /* a version 1 file does not say where each message's tokens begin */
        rc = firsts_known ? 0 : render(s, env, 0);
    } else {
        s->hist_tokens = 0;
        rc = kvp_session_retokenize(s, env);
    }
    if (rc < 0) {
        if (have_cache)
            kvp_cache_free(&c);
        kvp_session_clear_transcript(s);
        kvp_snapshot_free(&snap);
        snprintf(err, errlen, "restoring %s: re-tokenizing the transcript: %s", s->id,
                 strerror(-rc));
        return rc;
    }
    if (have_cache) {
        kvp_cache_free(&s->cache);
        s->cache = c;
        s->n_cached = snap.n_cached;
    } else {
        kvp_cache_reset(&s->cache);
        s->cache.evicted_rows = snap.evicted_rows;
        s->n_cached = 0;
        r->rebuilt = 1;
        snprintf(r->note, sizeof r->note, "%s", why);
    }
    /* Tokens kept from the snapshot were built by this daemon's template (a Jinja one
     * turn by turn); re-tokenized ones are the family's (kvp_session_retokenize). */
    if (!restart)
        s->jinja_rendered = env->tpl.jinja != NULL;
    /* Cut replies still need their end marker; a reply that ended has it last. */
    s->reply_open = s->n_msgs > 0 && s->n_tokens > 0 &&
                    !(!restart && kvp_template_is_stop(&env->tpl, s->tokens[s->n_tokens - 1]));
    s->turns_done = snap.turns;
    s->store_version = version;
    s->created_wall = snap.created;
    s->has_snapshot = 1;
    s->saved = 1;
    /* Appending goes on only where the files end cleanly, in this version, and hold these
     * very tokens. */
    s->journal_ok = journal_clean && !restart && snap.version == KVP_SNAPSHOT_VERSION;
    s->journal_msgs = s->hist_msgs + s->n_msgs;
    s->journal_tokens = s->hist_tokens + s->n_tokens;
    s->journal_bytes = journal_bytes;
    s->base_bytes = snap.cache_len + 4 * (size_t)snap.n_tokens;
    if (!journal_clean)
        snprintf(r->note + strlen(r->note), sizeof r->note - strlen(r->note), "%s%s",
                 r->note[0] ? "; " : "", jerr);
    r->pending = 1;
    kvp_snapshot_free(&snap);
    return 0;
}
