/* Sessions and the turn state machine. A turn is advanced one unit at a time (a prefill
 * chunk or one decoded token) in the batched step of whichever worker pulls it from the
 * run queue, so nothing of a turn lives in a worker's runstate between units: logits
 * are sampled in the step that made them. */
#include "sessions/session.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>

#include "base/checksum.h"
#include "model/matmul.h"
#include "model/tokenizer.h"
#include "policy/policy.h"
#include "sessions/canary.h"
#include "sessions/persist.h"
#include "sessions/rewind.h"
#include "store/store.h"

/* n bytes from the kernel's CSPRNG: 0 or -errno. */
static int random_bytes(void *buf, size_t n)
{
    unsigned char *raw = buf;
    size_t got = 0;
    while (got < n) {
        ssize_t k = getrandom(raw + got, n - got, 0);
        if (k < 0) {
            if (errno == EINTR)
                continue;
            return -errno;
        }
        got += (size_t)k;
    }
    return 0;
}

static int random_id(char *out)
{
    unsigned char raw[KVP_SESSION_ID_LEN / 2];
    int rc = random_bytes(raw, sizeof raw);
    if (rc < 0)
        return rc;
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(out + 2 * i, 3, "%02x", raw[i]);
    return 0;
}

kvp_policy_conf *kvp_policy_conf_ref(kvp_policy_conf *pc)
{
    pc->refs++;
    return pc;
}

void kvp_policy_conf_unref(kvp_policy_conf *pc)
{
    if (pc && --pc->refs == 0) {
        kvp_policy_weights_free(pc->weights);
        free(pc);
    }
}

/* ---- the table: an id hash, the list of every session, the resident list ---- */

static size_t bucket_of(const kvp_session_table *t, const char *id)
{
    return (size_t)kvp_fnv1a(KVP_FNV1A_INIT, id, strlen(id)) & (t->n_buckets - 1);
}

int kvp_session_table_init(kvp_session_table *t)
{
    memset(t, 0, sizeof *t);
    t->n_buckets = 64;
    t->buckets = calloc(t->n_buckets, sizeof *t->buckets);
    return t->buckets ? 0 : -ENOMEM;
}

/* Doubles the buckets when there are more sessions than buckets. */
static int table_grow(kvp_session_table *t)
{
    size_t n = t->n_buckets * 2;
    kvp_session **b = calloc(n, sizeof *b);
    if (!b)
        return -ENOMEM;
    kvp_session **old = t->buckets;
    size_t old_n = t->n_buckets;
    t->buckets = b;
    t->n_buckets = n;
    for (size_t i = 0; i < old_n; i++)
        for (kvp_session *s = old[i], *next; s; s = next) {
            next = s->hnext;
            size_t k = bucket_of(t, s->id);
            s->hnext = b[k];
            b[k] = s;
        }
    free(old);
    return 0;
}

static void resident_link(kvp_session_table *t, kvp_session *s)
{
    s->rprev = NULL;
    s->rnext = t->resident_head;
    if (t->resident_head)
        t->resident_head->rprev = s;
    t->resident_head = s;
    t->resident++;
}

static void resident_unlink(kvp_session_table *t, kvp_session *s)
{
    *(s->rprev ? &s->rprev->rnext : &t->resident_head) = s->rnext;
    if (s->rnext)
        s->rnext->rprev = s->rprev;
    s->rnext = s->rprev = NULL;
    t->resident--;
}

static int table_add(kvp_session_table *t, kvp_session *s)
{
    int rc;
    if (!t->n_buckets && (rc = kvp_session_table_init(t)) < 0)
        return rc;
    if ((size_t)t->count >= t->n_buckets && (rc = table_grow(t)) < 0)
        return rc;
    size_t k = bucket_of(t, s->id);
    s->hnext = t->buckets[k];
    t->buckets[k] = s;
    s->prev = t->tail;
    *(t->tail ? &t->tail->next : &t->head) = s;
    t->tail = s;
    resident_link(t, s);
    t->count++;
    t->created_total++;
    return 0;
}

/* Frees what a turn holds and zeroes it. */
static void turn_clear(kvp_turn *t)
{
    free(t->text);
    free(t->reply);
    for (int i = 0; i < t->n_stop; i++)
        free(t->stop[i]);
    free(t->tools);
    free(t->prefix);
    free(t->tok_end);
    free(t->lp);
    free(t->lp_row);
    free((void *)t->sampling.bias);
    kvp_turn_grammar_free(t);
    kvp_canary_rec_free(t->canary);
    memset(t, 0, sizeof *t);
}

static void session_free(kvp_session *s)
{
    kvp_cache_free(&s->cache);
    if (s->policy)   /* before the conf: it may read the conf's shared weights */
        kvp_policy_destroy(s->policy);
    kvp_policy_conf_unref(s->pconf);
    kvp_sampler_free(&s->sampler);
    free(s->tokens);
    for (int i = 0; i < s->n_msgs; i++)
        free(s->msgs[i].text);
    free(s->msgs);
    free(s->msg_tok);
    free(s->system);
    kvp_session_rewind_clear(s);
    turn_clear(&s->turn);
    free(s);
}

int kvp_session_create(kvp_session_table *t, const kvp_session_env *env, kvp_policy_conf *pc,
                       const char *id, double now, kvp_session **out, char *err, size_t errlen)
{
    kvp_session *s = calloc(1, sizeof *s);
    if (!s) {
        snprintf(err, errlen, "out of memory");
        return -ENOMEM;
    }
    const kvp_model_config *cfg = &env->model->cfg;
    int rc;
    if (id)
        snprintf(s->id, sizeof s->id, "%s", id);
    else
        do {
            if ((rc = random_id(s->id)) < 0) {
                snprintf(err, errlen, "getrandom: %s", strerror(-rc));
                free(s);
                return rc;
            }
        } while (kvp_session_find(t, s->id)); /* astronomically unlikely, but cheap */
    /* Every session gets its own stream of random numbers, from the CSPRNG: a client
     * must not predict another session's samples from its own or from the order of
     * creation (a turn that wants reproducible samples gives its own seed). */
    uint64_t seed;
    if ((rc = random_bytes(&seed, sizeof seed)) < 0) {
        snprintf(err, errlen, "getrandom: %s", strerror(-rc));
        free(s);
        return rc;
    }
    seed ^= env->seed;
    if ((rc = kvp_cache_init(&s->cache, cfg->n_layers, cfg->n_kv_heads, cfg->head_dim,
                             &cfg->rope)) < 0 ||
        (rc = kvp_cache_convert(&s->cache, env->kv_type)) < 0) {
        snprintf(err, errlen, "cache: %s", strerror(-rc));
        free(s);
        return rc;
    }
    s->seed = seed;   /* the policy is made by the first turn's worker */
    if ((rc = kvp_sampler_init(&s->sampler, cfg->vocab_size, 0.0f, env->top_p, seed)) < 0) {
        snprintf(err, errlen, "sampler: %s", strerror(-rc));
        session_free(s);
        return rc;
    }
    s->created = s->last_active = now;
    s->created_wall = kvp_wall_now();
    s->hist_hash = KVP_FNV1A_INIT;
    s->pconf = kvp_policy_conf_ref(pc);
    if ((rc = table_add(t, s)) < 0) {
        snprintf(err, errlen, "out of memory");
        session_free(s);
        return rc;
    }
    *out = s;
    return 0;
}

kvp_session *kvp_session_find(const kvp_session_table *t, const char *id)
{
    if (!t->n_buckets)
        return NULL;
    for (kvp_session *s = t->buckets[bucket_of(t, id)]; s; s = s->hnext)
        if (!strcmp(s->id, id))
            return s;
    return NULL;
}

void kvp_session_remove(kvp_session_table *t, kvp_session *s)
{
    for (kvp_session **p = &t->buckets[bucket_of(t, s->id)]; *p; p = &(*p)->hnext)
        if (*p == s) {
            *p = s->hnext;
            break;
        }
    *(s->prev ? &s->prev->next : &t->head) = s->next;
    *(s->next ? &s->next->prev : &t->tail) = s->prev;
    if (s->state != KVP_SESSION_PARKED)
        resident_unlink(t, s);
    t->count--;
    session_free(s);
}

void kvp_session_table_clear(kvp_session_table *t)
{
    while (t->head) {
        kvp_session *s = t->head;
        t->head = s->next;
        session_free(s);
    }
    free(t->buckets);
    memset(t, 0, sizeof *t);
}

void kvp_session_clear_transcript(kvp_session *s)
{
    for (int i = 0; i < s->n_msgs; i++)
        free(s->msgs[i].text);
    free(s->msgs);
    free(s->msg_tok);
    s->msgs = NULL;
    s->msg_tok = NULL;
    s->n_msgs = s->cap_msgs = 0;
    s->n_tokens = 0;
}

int kvp_session_parkable(const kvp_session *s)
{
    return s->state == KVP_SESSION_IDLE &&
           (s->saved || (s->n_msgs == 0 && !s->has_snapshot));
}

void kvp_session_park(kvp_session_table *t, kvp_session *s)
{
    kvp_cache_reset(&s->cache);
    if (s->policy)
        kvp_policy_destroy(s->policy);
    s->policy = NULL;
    kvp_sampler_free(&s->sampler);
    kvp_session_clear_transcript(s);
    free(s->tokens);
    s->tokens = NULL;
    s->cap_tokens = s->n_cached = 0;
    turn_clear(&s->turn);
    s->reply_open = 0;
    s->state = KVP_SESSION_PARKED;
    s->bytes = 0;
    resident_unlink(t, s);
}

int kvp_session_unpark(kvp_session_table *t, kvp_session *s, const kvp_session_env *env)
{
    int rc = kvp_sampler_init(&s->sampler, env->model->cfg.vocab_size, 0.0f, env->top_p,
                              s->seed);
    if (rc < 0)
        return rc;
    s->state = KVP_SESSION_IDLE;
    s->need_restore = s->has_snapshot;
    resident_link(t, s);
    return 0;
}

void kvp_session_begin_job(kvp_session *s)
{
    s->save_rc = 0;
    s->lost = 0;
}

int kvp_session_begin_turn(kvp_session *s, const char *text, size_t len, int max_tokens,
                           float temperature, int budget, double now)
{
    kvp_turn *t = &s->turn;
    turn_clear(t);
    t->text = malloc(len + 1);
    if (!t->text)
        return -ENOMEM;
    memcpy(t->text, text, len);
    t->text[len] = '\0';
    t->text_len = len;
    t->max_tokens = max_tokens;
    t->temperature = temperature;
    t->top_p = -1;
    t->budget = budget;
    kvp_session_begin_job(s);
    atomic_init(&t->cancel, 0);
    t->state = KVP_TURN_START;
    s->io_next = 1;   /* turn_start, a job before the turn's first step */
    t->t_start = now;
    return 0;
}

int kvp_session_turn_logprobs(kvp_session *s, int vocab, int top)
{
    kvp_turn *t = &s->turn;
    if (top < 0)
        return 0;
    if (top > KVP_LOGPROBS_MAX_TOP || vocab <= 0 || t->max_tokens <= 0)
        return -EINVAL;
    int k = top < vocab ? top : vocab;
    t->lp = malloc((size_t)t->max_tokens * (size_t)(1 + k) * sizeof *t->lp);
    t->lp_row = malloc((size_t)vocab * sizeof *t->lp_row);
    /* each token's end in the reply, so token events and a stop string's cut know which
     * tokens' text is out (grown here, never in the step) */
    size_t *te = realloc(t->tok_end, (size_t)t->max_tokens * sizeof *te);
    if (te) {
        t->tok_end = te;
        t->tok_end_cap = t->max_tokens;
    }
    if (!t->lp || !t->lp_row || !te) {
        free(t->lp);
        free(t->lp_row);
        t->lp = NULL;
        t->lp_row = NULL;
        return -ENOMEM;
    }
    t->lp_on = 1;
    t->lp_k = k;
    t->lp_cap = t->max_tokens;
    return 0;
}

int kvp_session_turn_stops(kvp_session *s, const char *const *stop, const size_t *len, int n)
{
    kvp_turn *t = &s->turn;
    if (n < 0 || n > KVP_HUB_MAX_STOPS)
        return -EINVAL;
    for (int i = 0; i < n; i++)
        if (len[i] < 1 || len[i] > KVP_HUB_STOP_MAX)
            return -EINVAL;
    for (int i = 0; i < n; i++) {
        if (!(t->stop[i] = malloc(len[i])))
            return -ENOMEM;   /* turn_clear frees the ones made */
        memcpy(t->stop[i], stop[i], len[i]);
        t->stop_len[i] = len[i];
        t->n_stop = i + 1;
        if (len[i] - 1 > t->stop_hold)
            t->stop_hold = len[i] - 1;
    }
    return 0;
}

static char *dup_bytes(const char *p, size_t n)
{
    char *c = malloc(n + 1);
    if (c) {
        memcpy(c, p, n);
        c[n] = '\0';
    }
    return c;
}

int kvp_session_turn_tools(kvp_session *s, const kvp_turn_opts *o)
{
    kvp_turn *t = &s->turn;
    t->role = o->role == KVP_MESSAGE_TOOL ? KVP_MESSAGE_TOOL : 1;
    if (o->tools_len && !(t->tools = dup_bytes(o->tools, o->tools_len)))
        return -ENOMEM;
    t->tools_len = o->tools_len;
    if (o->reply_prefix_len && !(t->prefix = dup_bytes(o->reply_prefix, o->reply_prefix_len)))
        return -ENOMEM;
    t->prefix_len = o->reply_prefix_len;
    if (o->end_after_len && t->n_stop <= KVP_HUB_MAX_STOPS) {
        int i = t->n_stop;
        if (!(t->stop[i] = dup_bytes(o->end_after, o->end_after_len)))
            return -ENOMEM;
        t->stop_len[i] = o->end_after_len;
        t->stop_keep[i] = 1;
        t->n_stop = i + 1;
        if (o->end_after_len - 1 > t->stop_hold)
            t->stop_hold = o->end_after_len - 1;
    }
    return 0;
}

int kvp_session_turn_sampling(kvp_session *s, const kvp_sample_opts *o)
{
    kvp_turn *t = &s->turn;
    const char *field;
    if (kvp_sample_opts_check(o, s->sampler.vocab_size, &field) < 0)
        return -EINVAL;
    kvp_logit_bias *b = NULL;
    if (o->n_bias && !(b = malloc((size_t)o->n_bias * sizeof *b)))
        return -ENOMEM;
    if (b)
        memcpy(b, o->bias, (size_t)o->n_bias * sizeof *b);
    free((void *)t->sampling.bias);
    t->sampling = *o;
    t->sampling.bias = b;
    return 0;
}

static int push_token(kvp_session *s, int id)
{
    if (s->n_tokens == s->cap_tokens) {
        int cap = s->cap_tokens ? s->cap_tokens * 2 : 256;
        int *v = realloc(s->tokens, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        s->tokens = v;
        s->cap_tokens = cap;
    }
    s->tokens[s->n_tokens++] = id;
    return 0;
}

static int push_message(kvp_session *s, int user, const char *text, size_t len, int first);

/* With the model's own Jinja template (kvp_template_jinja_turn): the whole conversation
 * with the new user message rendered, the transcript kept as far as the rendering agrees
 * with it. Where the template renders an earlier turn differently now (Qwen3 drops an
 * earlier reply's think block), the transcript and the cache go back to the longest
 * shared prefix (the journal's next save is a full one) and the rest is prefilled anew.
 * *ids (malloc'd) are the tokens to append. Returns their count, or -ENOENT when the
 * family renders this turn: no Jinja template, dropped history (the rendering would
 * start at the conversation's beginning), or a conversation the template refuses. */
static int jinja_turn(kvp_session *s, const kvp_session_env *env, kvp_turn *t, int **ids)
{
    if (!env->tpl.jinja || s->hist_tokens != 0)
        return -ENOENT;
    kvp_chat_msg *cm = malloc(sizeof *cm * ((size_t)s->n_msgs + 1));
    if (!cm)
        return -ENOMEM;
    for (int i = 0; i < s->n_msgs; i++)
        cm[i] = (kvp_chat_msg){s->msgs[i].user, s->msgs[i].text, s->msgs[i].len};
    cm[s->n_msgs] = (kvp_chat_msg){t->role ? t->role : 1, t->text, t->text_len};
    int common = 0;
    int n = kvp_template_jinja_turn_tools(&env->tpl, s->system, s->system_len, cm,
                                          s->n_msgs + 1, t->tools, t->tools_len, s->tokens,
                                          s->n_tokens, s->jinja_rendered, &common, ids);
    free(cm);
    if (n < 0)
        return n == -ENOMEM ? n : -ENOENT;
    if (common < s->n_tokens) {
        if (s->n_cached > common) {
            kvp_cache_drop_newest(&s->cache, s->n_cached - common);
            s->n_cached = common;
        }
        s->n_tokens = common;
        for (int i = 0; i < s->n_msgs; i++)
            if (s->msg_tok[i] > common)
                s->msg_tok[i] = common;
        s->journal_ok = 0;
        t->undo_tokens = common;
    }
    s->jinja_rendered = 1;
    return n;
}

int kvp_session_seed(kvp_session *s, const kvp_message *msgs, int n)
{
    /* no tokens yet: the first turn renders them (kvp_session_retokenize) */
    for (int i = 0; i < n; i++)
        if (push_message(s, msgs[i].user, msgs[i].text, msgs[i].len, 0) < 0)
            return -ENOMEM;
    return 0;
}

int kvp_session_set_system(kvp_session *s, const char *system, size_t len)
{
    free(s->system);
    s->system = NULL;
    s->system_len = 0;
    if (!len)
        return 0;
    if (!(s->system = malloc(len + 1)))
        return -ENOMEM;
    memcpy(s->system, system, len);
    s->system[len] = '\0';
    s->system_len = len;
    return 0;
}

uint64_t kvp_session_transcript_hash(const char *system, size_t system_len,
                                     const kvp_message *msgs, int n)
{
    uint64_t h = KVP_FNV1A_INIT;
    if (system_len) {   /* role 2: no message has it */
        uint64_t head[2] = {2, (uint64_t)system_len};
        h = kvp_fnv1a(h, head, sizeof head);
        h = kvp_fnv1a(h, system, system_len);
    }
    return kvp_session_transcript_hash_more(h, msgs, n);
}

/* The state after the system text and the dropped messages: where the kept ones go on. */
static uint64_t hash_before_kept(const kvp_session *s)
{
    return s->hist_msgs ? s->hist_hash
                        : kvp_session_transcript_hash(s->system, s->system_len, NULL, 0);
}

uint64_t kvp_session_hash(const kvp_session *s)
{
    return kvp_session_transcript_hash_more(hash_before_kept(s), s->msgs, s->n_msgs);
}

uint64_t kvp_tenant_mix(const char *tenant)
{
    return tenant[0] ? kvp_fnv1a(KVP_FNV1A_INIT, tenant, strlen(tenant)) : 0;
}

uint64_t kvp_session_index_hash(const kvp_session *s)
{
    return kvp_session_hash(s) ^ kvp_tenant_mix(s->tenant);
}

uint64_t kvp_session_transcript_hash_more(uint64_t h, const kvp_message *msgs, int n)
{
    for (int i = 0; i < n; i++) {
        /* role and length first, so no two transcripts render to the same bytes */
        uint64_t head[2] = {(uint64_t)msgs[i].user, (uint64_t)msgs[i].len};
        h = kvp_fnv1a(h, head, sizeof head);
        h = kvp_fnv1a(h, msgs[i].text, msgs[i].len);
    }
    return h;
}

/* first: where the message's tokens begin in tokens[]. */
static int push_message(kvp_session *s, int user, const char *text, size_t len, int first)
{
    if (s->n_msgs == s->cap_msgs) {
        int cap = s->cap_msgs ? s->cap_msgs * 2 : 16;
        kvp_message *v = realloc(s->msgs, (size_t)cap * sizeof *v);
        if (v)
            s->msgs = v;
        int *f = v ? realloc(s->msg_tok, (size_t)cap * sizeof *f) : NULL;
        if (!f)
            return -ENOMEM;
        s->msg_tok = f;
        s->cap_msgs = cap;
    }
    char *copy = malloc(len + 1);
    if (!copy)
        return -ENOMEM;
    memcpy(copy, text, len);
    copy[len] = '\0';
    s->msgs[s->n_msgs].user = user;
    s->msgs[s->n_msgs].text = copy;
    s->msgs[s->n_msgs].len = len;
    s->msg_tok[s->n_msgs] = first;
    s->n_msgs++;
    return 0;
}

/* max_history_tokens, at the end of a turn: drops the oldest whole turns (a user message
 * and the replies after it) while the tokens from the next kept turn on are more than
 * max; the newest turn always stays. Only tokens that are in the cache go (the cache
 * itself keeps them: positions and rows do not change), so the next turn's prefill, the
 * context shift and the sampler see nothing of it. */
static void bound_history(kvp_session *s, int max)
{
    if (max <= 0 || s->n_tokens <= max)
        return;
    int last = s->n_msgs - 1;
    while (last > 0 && !s->msgs[last].user)
        last--;
    int keep = 1;   /* the first kept message: a user one, at most the newest turn's */
    while (keep < last && (!s->msgs[keep].user || s->n_tokens - s->msg_tok[keep] > max))
        keep++;
    int cut = s->msg_tok[keep];
    if (keep > last || cut <= 0 || cut > s->n_cached || cut >= s->n_tokens)
        return;   /* nothing to drop, or it would take tokens not yet run */
    s->hist_hash = kvp_session_transcript_hash_more(hash_before_kept(s), s->msgs, keep);
    for (int i = 0; i < keep; i++)
        free(s->msgs[i].text);
    s->n_msgs -= keep;
    memmove(s->msgs, s->msgs + keep, (size_t)s->n_msgs * sizeof *s->msgs);
    for (int i = 0; i < s->n_msgs; i++)
        s->msg_tok[i] = s->msg_tok[i + keep] - cut;
    s->n_tokens -= cut;
    s->n_cached -= cut;
    memmove(s->tokens, s->tokens + cut, (size_t)s->n_tokens * sizeof *s->tokens);
    s->hist_msgs += keep;
    s->hist_tokens += cut;
}

/* The cache was dropped: with history dropped before, the kept tokens do not start a
 * conversation (no beginning-of-text, no system text), so the next turn renders the
 * kept messages again as a conversation of their own (kvp_turn_step's seeded path). */
static void restart_tokens(kvp_session *s)
{
    if (s->hist_tokens == 0)
        return;
    s->n_tokens = 0;
    s->hist_tokens = 0;
    for (int i = 0; i < s->n_msgs; i++)
        s->msg_tok[i] = 0;   /* none rendered yet */
    s->journal_ok = 0;   /* other tokens than on disk: the next save is a full one */
}

static int reply_append(kvp_turn *t, const char *p, size_t n)
{
    if (t->reply_len + n + 1 > t->reply_cap) {
        size_t cap = t->reply_cap ? t->reply_cap : 256;
        while (cap < t->reply_len + n + 1)
            cap *= 2;
        char *r = realloc(t->reply, cap);
        if (!r)
            return -ENOMEM;
        t->reply = r;
        t->reply_cap = cap;
    }
    memcpy(t->reply + t->reply_len, p, n);
    t->reply_len += n;
    t->reply[t->reply_len] = '\0';
    return 0;
}

/* With logprobs: how many of the reply's tokens have all their text in reply[0..upto)
 * (a token that ends inside a character is whole once a later token ends it). */
static int lp_whole(const kvp_turn *t, size_t upto)
{
    int n = t->lp_sent;
    for (int i = t->lp_sent; i < t->stats.generated_tokens; i++) {
        if (t->tok_end[i] == SIZE_MAX)
            continue;
        if (t->tok_end[i] > upto)
            break;
        n = i + 1;
    }
    return n;
}

/* Gives the sink the reply up to `upto` (what it has not had yet), with the logprobs of
 * the tokens that text completes (lp_from..lp_to, read by the sink). */
static void emit(kvp_session *s, const kvp_turn_sink *sink, size_t upto)
{
    kvp_turn *t = &s->turn;
    if (upto > t->sent) {
        t->lp_from = t->lp_to = t->lp_sent;
        if (t->lp_on)
            t->lp_to = t->lp_sent = lp_whole(t, upto);
        sink->token(sink->ctx, s, t->reply + t->sent, upto - t->sent);
        t->lp_from = t->lp_to = t->lp_sent;
        t->sent = upto;
    }
}

/* Reply text (valid UTF-8): kept and looked through for the turn's stop strings; returns
 * how much of the reply may go to the sink: all but what could still begin one (held
 * back until it cannot, or the turn ends). After a stop string nothing more is kept.
 * *err: 0 or -ENOMEM. */
static size_t reply_keep(kvp_turn *t, const char *p, size_t n, int *err)
{
    *err = 0;
    if (t->stopped)
        return t->sent;
    size_t from = t->reply_len;
    if (reply_append(t, p, n) < 0) {
        *err = -ENOMEM;
        return t->sent;
    }
    size_t upto = t->reply_len;
    if (t->n_stop) {
        /* only where a stop string could end in the new text */
        size_t start = from > t->stop_hold ? from - t->stop_hold : 0;
        for (int i = 0; i < t->n_stop; i++) {
            const char *hit = memmem(t->reply + start, t->reply_len - start, t->stop[i],
                                     t->stop_len[i]);
            size_t end = hit ? (size_t)(hit - t->reply) + (t->stop_keep[i] ? t->stop_len[i] : 0) : 0;
            if (hit && (!t->stopped || end < t->stop_at)) {
                t->stopped = 1;
                t->stop_at = end;
            }
        }
        upto = t->stopped ? t->stop_at : t->reply_len > t->stop_hold ? t->reply_len - t->stop_hold : 0;
        while (upto > t->sent && upto < t->reply_len &&
               ((unsigned char)t->reply[upto] & 0xC0) == 0x80)
            upto--;   /* whole characters only */
    }
    return upto;
}

/* reply_keep, then the sink gets what may go out. */
static int reply_text(kvp_session *s, const kvp_turn_sink *sink, const char *p, size_t n)
{
    int err;
    size_t upto = reply_keep(&s->turn, p, n, &err);
    if (err)
        return err;
    emit(s, sink, upto);
    return 0;
}

/* The reply's opening kvpd writes itself (a forced tool call): its tokens go into the
 * transcript to be prefilled with the prompt, its text starts the reply (and is looked
 * through for the stop strings, so a whole forced call may end the turn at once). */
static int reply_prefix(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink)
{
    kvp_turn *t = &s->turn;
    int *ids = NULL;
    int n = kvp_template_encode_trusted(&env->tpl, t->prefix, t->prefix_len, &ids);
    if (n < 0)
        return n;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = push_token(s, ids[i]);
    free(ids);
    return rc ? rc : reply_text(s, sink, t->prefix, t->prefix_len);
}

/* With stop strings: where the reply stood after its newest token. */
static int note_token_end(kvp_turn *t)
{
    int g = t->stats.generated_tokens;
    if (g > t->tok_end_cap) {
        int cap = t->tok_end_cap ? 2 * t->tok_end_cap : 64;
        size_t *v = realloc(t->tok_end, (size_t)cap * sizeof *v);
        if (!v)
            return -ENOMEM;
        t->tok_end = v;
        t->tok_end_cap = cap;
    }
    t->tok_end[g - 1] = t->utf8.n ? SIZE_MAX : t->reply_len;
    return 0;
}

/* A stop string ended the reply at stop_at: the transcript ends there too — the stop
 * text and what followed leave the tokens and the cache — so the client's next request,
 * which sends the reply back without the stop text, continues this session. The reply's
 * tokens stay up to the last one that ends at or before the cut; the text between it and
 * the cut is tokenized again (not yet run: the next turn prefills it). */
static int cut_at_stop(kvp_session *s, const kvp_session_env *env)
{
    kvp_turn *t = &s->turn;
    int keep = 0;
    size_t at = t->prefix_len;   /* the prefix's tokens stand before gen_start */
    for (int i = t->stats.generated_tokens - 1; i >= 0; i--)
        if (t->tok_end[i] <= t->stop_at) {
            keep = i + 1;
            at = t->tok_end[i];
            break;
        }
    int end = t->gen_start + keep;
    if (s->n_cached > end) {
        kvp_cache_drop_newest(&s->cache, s->n_cached - end);
        s->n_cached = end;
    }
    s->n_tokens = end;
    int *ids = NULL;
    int n = kvp_template_reply(&env->tpl, t->reply + at, t->stop_at - at, &ids);
    if (n < 0)
        return n;
    int rc = 0;
    for (int i = 0; i < n && !rc; i++)
        rc = push_token(s, ids[i]);
    free(ids);
    return rc;
}

static void note_rows(kvp_session *s)
{
    int r = kvp_cache_max_rows(&s->cache);
    if (r > s->turn.stats.cache_rows_max)
        s->turn.stats.cache_rows_max = r;
    size_t b = kvp_cache_bytes(&s->cache);
    if (b > s->turn.stats.cache_bytes_max)
        s->turn.stats.cache_bytes_max = b;
}

static kvp_evict_cfg evict_cfg(const kvp_session *s, const kvp_session_env *env)
{
    kvp_evict_cfg e = {s->policy, s->turn.budget, env->chunk, env->budget_mode};
    return e;
}

/* The end of every turn, done or failed: the snapshot follows memory. */
static void save(kvp_session *s, const kvp_session_env *env)
{
    if (!env->store)
        return;
    int rc = kvp_session_save(s, env, s->save_err, sizeof s->save_err);
    s->save_rc = rc < 0 ? rc : 1;
    s->saved = rc == 0;
    s->has_snapshot |= rc == 0;
}

/* A turn's last unit: its snapshot written (with a store), then its final event, the
 * worker's last touch of the session. Returns 0 (the turn ended). */
static int turn_report(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink)
{
    kvp_turn *t = &s->turn;
    s->io_next = 0;
    t->end = 0;
    save(s, env);
    if (t->end_code < 0)
        sink->error(sink->ctx, s, t->end_code, t->end_msg);
    else
        sink->done(sink->ctx, s, &t->stats, t->reply ? t->reply : "", t->reply_len);
    return 0;
}

/* The end of every turn, done (code 0) or failed (code < 0, msg): the final event is
 * sent only once the snapshot is written, and that write waits on the disk or the
 * network, so with a store the turn leaves the batched step here and its end is a unit
 * of its own (turn_report, run as a job: the step never waits on the store). Returns as
 * kvp_turn_step. */
static int end_turn(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                    int code, const char *msg)
{
    kvp_turn *t = &s->turn;
    t->end = 1;
    t->end_code = code;
    snprintf(t->end_msg, sizeof t->end_msg, "%s", msg ? msg : "");
    if (!env->store)
        return turn_report(s, env, sink);
    s->io_next = 1;
    return 1;
}

/* Ends the turn: turn-boundary eviction, transcript, stats. */
static int finish(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                  const char *stop)
{
    kvp_turn *t = &s->turn;
    char tail[4];
    size_t n = kvp_utf8_flush(&t->utf8, tail);
    if (t->lp_on && !t->stopped)   /* the reply's end ends its last tokens */
        for (int i = t->stats.generated_tokens - 1; i >= 0 && t->tok_end[i] == SIZE_MAX; i--)
            t->tok_end[i] = t->reply_len + n;
    int rc = n ? reply_text(s, sink, tail, n) : 0;
    if (t->lp_on)   /* the tokens whose text is returned: up to a stop string's cut */
        t->lp_n = lp_whole(t, t->stopped ? t->stop_at : SIZE_MAX - 1);
    if (!rc && t->stopped) {
        rc = cut_at_stop(s, env);
        stop = "stop";
        t->reply_len = t->stop_at;
        if (t->reply)
            t->reply[t->reply_len] = '\0';
    }
    emit(s, sink, t->reply_len);   /* what was held back for the stop strings */
    kvp_evict_cfg e = evict_cfg(s, env);
    int dropped = kvp_gen_compress(&s->cache, &e);
    if (dropped < 0 && !rc)
        rc = dropped;
    if (!rc)
        rc = push_message(s, 0, t->reply ? t->reply : "", t->reply_len, t->reply_from);
    if (rc < 0) {
        free(t->text);
        t->text = NULL;
        return end_turn(s, env, sink, rc, "could not finish the turn");
    }
    bound_history(s, t->max_history);
    double end = kvp_now();
    kvp_turn_stats *st = &t->stats;
    st->transcript_tokens = (int)(s->hist_tokens + s->n_tokens);
    st->cache_rows = kvp_cache_max_rows(&s->cache);
    if (st->cache_rows > st->cache_rows_max)
        st->cache_rows_max = st->cache_rows;
    st->cache_bytes = kvp_cache_bytes(&s->cache);
    st->evicted_total = s->cache.evicted_rows;
    st->evicted_rows = s->cache.evicted_rows - t->evicted_at_start;
    st->duration_ms = (end - t->t_start) * 1e3;
    st->ttft_ms = t->t_first > 0 ? (t->t_first - t->t_start) * 1e3 : st->duration_ms;
    st->tokens_per_s = end > t->t_start ? st->generated_tokens / (end - t->t_start) : 0;
    st->stop = stop;
    if (st->cache_bytes > st->cache_bytes_max)
        st->cache_bytes_max = st->cache_bytes;
    free(t->text);
    t->text = NULL;
    s->turns_done++;
    return end_turn(s, env, sink, 0, NULL);
}

/* Ends a failed turn so the session stays usable: the cache may be half-updated, so it
 * is dropped and the next turn re-prefills the transcript. With `undo` (the turn failed
 * before its reply began) the transcript goes back to where this turn found it: its
 * tokens, and its user message if it was recorded; never anything of earlier turns. */
static int fail(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                int undo, int rc, const char *what, const char *detail)
{
    kvp_turn *t = &s->turn;
    kvp_cache_reset(&s->cache);
    s->n_cached = 0;
    if (undo) {
        s->n_tokens = t->undo_tokens;
        if (t->recorded)
            free(s->msgs[--s->n_msgs].text);
    }
    restart_tokens(s);
    char msg[160];
    snprintf(msg, sizeof msg, "%s: %s", what, detail ? detail :
             rc == -E2BIG ? "the conversation outgrew the model's context" : strerror(-rc));
    free(t->text);
    t->text = NULL;
    return end_turn(s, env, sink, rc, msg);
}

/* A sampled token: stop, or stream it and keep going. Returns as kvp_turn_step. */
static int take_token(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                      int tok)
{
    kvp_turn *t = &s->turn;
    if (t->stopped)   /* the reply's prefix ended it: the sampled token is not kept */
        return finish(s, env, sink, "stop");
    if (kvp_template_is_stop(&env->tpl, tok)) {
        /* A chat format's end marker belongs to the transcript (fed next turn). */
        if (kvp_template_keeps_stop(&env->tpl) && push_token(s, tok) < 0)
            return fail(s, env, sink, 0, -ENOMEM, "transcript", NULL);
        s->reply_open = 0;
        return finish(s, env, sink, "eos");
    }
    /* Past the lease this node surely holds, another node may serve the session: the
     * turn stops here and is not kept (the client sends it again). */
    if (env->store && kvp_store_lease_left_ms(env->store, s->id) == 0)
        return fail(s, env, sink, 1, -ENOLCK, "lease", "this node's lease ran out before "
                    "the turn ended (the store did not answer in time); the turn is cut and "
                    "not kept: send it again");
    int prev = s->n_tokens ? s->tokens[s->n_tokens - 1] : -1;
    if (push_token(s, tok) < 0)
        return fail(s, env, sink, 0, -ENOMEM, "transcript", NULL);
    t->stats.generated_tokens++;
    if (t->t_first == 0)
        t->t_first = kvp_now();
    size_t plen = 0, upto = t->sent;
    const char *piece = kvp_tokenizer_piece(&env->model->tok, prev, tok, &plen);
    if (piece && plen) {
        char buf[3 * 64 + 4];
        size_t off = 0;
        while (off < plen) {   /* pieces are short; chunk anyway to bound buf */
            size_t n = plen - off > 64 ? 64 : plen - off;
            size_t o = kvp_utf8_feed(&t->utf8, piece + off, n, buf);
            int err = 0;
            if (o)
                upto = reply_keep(t, buf, o, &err);
            if (err)
                return fail(s, env, sink, 0, -ENOMEM, "reply", NULL);
            off += n;
        }
    }
    /* the token's end first, so the text it sends carries its logprobs */
    if ((t->n_stop || t->lp_on) && note_token_end(t) < 0)
        return fail(s, env, sink, 0, -ENOMEM, "reply", NULL);
    emit(s, sink, upto);
    if (t->stopped)
        return finish(s, env, sink, "stop");
    if (t->stats.generated_tokens >= t->max_tokens)
        return finish(s, env, sink, "length");
    t->next_token = tok;
    t->state = KVP_TURN_DECODE;
    return 1;
}

/* Before a load or a turn: this node takes the session's lease (store/store.h). 0 to
 * go on; -EADDRINUSE when another node serves it (s->elsewhere_ms: for how long yet).
 * When the store's snapshot is another version than the one memory descends from
 * (another node served turns meanwhile), memory is dropped for the snapshot. When the
 * store cannot be reached, a session in memory goes on only while this node's lease
 * surely lasts (its snapshot write will fail and say so): past that another node may
 * hold it. One that must be read first cannot. */
static int take_lease(kvp_session *s, const kvp_session_env *env, char *err, size_t errlen)
{
    s->elsewhere_ms = 0;
    if (!env->store)
        return 0;
    int stored, left;
    uint64_t version;
    char holder[KVP_STORE_NODE_MAX + 1];
    int rc = kvp_store_lease_take(env->store, s->id, &stored, &version, &left, holder,
                                  sizeof holder, err, errlen);
    if (rc < 0) {   /* in memory and still ours: served from there */
        if (s->need_restore || kvp_store_lease_left_ms(env->store, s->id) > 0)
            return s->need_restore ? rc : 0;
        size_t used = strlen(err);
        snprintf(err + used, errlen - used, "; this node's lease on session %.8s has run out, "
                 "so it is not served until the store answers (try again)", s->id);
        return rc;
    }
    if (rc == KVP_LEASE_OTHER) {
        s->elsewhere_ms = left > 0 ? left : 1;
        snprintf(err, errlen, "session %s is being served by another node (%s); retry in %d ms",
                 s->id, holder, s->elsewhere_ms);
        return -EADDRINUSE;
    }
    if (!s->need_restore && kvp_store_has_leases(env->store) && version &&
        version != s->store_version) {
        kvp_session_forget(s);
        s->need_restore = 1;
        kvp_store_note_takeover(env->store);
    }
    return 0;
}

/* A turn's first unit, run as a job before the turn joins a batched step: everything
 * here may wait on the disk or the network, or take a while without the model (the
 * lease, the snapshot of an unparked session, its policy, a seeded transcript tokenized,
 * the user message into the transcript), so none of it holds back the other turns.
 * Returns as kvp_turn_step. */
static int turn_start(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink)
{
    kvp_turn *t = &s->turn;
    s->io_next = 0;
    {
        char err[256];
        int rc = take_lease(s, env, err, sizeof err);
        if (rc < 0) {
            free(t->text);
            t->text = NULL;
            sink->error(sink->ctx, s, rc, err);
            return 0;
        }
    }
    if (s->need_restore) {
        /* Unparking: the snapshot comes back before the turn's first unit. */
        char err[256];
        int rc = kvp_session_restore(s, env, s->reserve, err, sizeof err);
        if (rc < 0) {
            s->lost = rc == -ENOENT || rc == -EBADMSG;
            free(t->text);
            t->text = NULL;
            sink->error(sink->ctx, s, rc, err);
            return 0;
        }
        s->need_restore = 0;
    }
    t->undo_tokens = s->n_tokens;   /* where a failure before the reply goes back to */
    if (!s->policy) {
        /* On the conf's shared weights (no file read); a conf without them (made by
         * hand) has its file read here, on this worker. */
        char err[160];
        int rc = s->pconf->weights
                     ? kvp_policy_create_shared(&s->policy, s->pconf->weights,
                                                &env->model->cfg, s->seed, err, sizeof err)
                     : kvp_policy_create(&s->policy, s->pconf->name,
                                         s->pconf->file[0] ? s->pconf->file : NULL,
                                         &env->model->cfg, s->seed, err, sizeof err);
        if (rc < 0) {
            s->policy = NULL;
            return fail(s, env, sink, 1, rc, "policy", err);
        }
    }

    /* A request that continues this session from an earlier point (sessions/rewind.h):
     * its history replaces the transcript, the cache is cut back below. */
    int *rw_old = NULL, rw_n = 0;
    {
        int rc = kvp_session_rewind_apply(s, env, &rw_old, &rw_n);
        t->undo_tokens = s->n_tokens;
        if (rc < 0)
            return fail(s, env, sink, 1, rc, "transcript", NULL);
    }
    /* A session seeded with a conversation (kvp_session_seed): its messages first. */
    if (s->n_tokens == 0 && s->n_msgs > 0) {
        int rc = kvp_session_retokenize(s, env);
        if (rc < 0)
            return fail(s, env, sink, 1, rc, "tokenize", NULL);
        s->reply_open = 1;
    }
    /* A cancel that came before any work still records the message: the next turn
     * prefills it (prefill checks the flag first). */
    int *ids = NULL;
    int n = jinja_turn(s, env, t, &ids);
    if (n == -ENOENT) {
        s->jinja_rendered = 0;
        n = kvp_template_turn(&env->tpl, s->system, s->system_len, s->n_tokens == 0,
                              s->reply_open, t->text, t->text_len, &ids);
    }
    int first = s->n_tokens;
    if (n < 0) {
        free(rw_old);
        return fail(s, env, sink, 1, n, "tokenize", NULL);
    }
    for (int i = 0; i < n; i++)
        if (push_token(s, ids[i]) < 0) {
            free(ids);
            free(rw_old);
            return fail(s, env, sink, 1, -ENOMEM, "transcript", NULL);
        }
    free(ids);
    if (push_message(s, t->role ? t->role : 1, t->text, t->text_len, first) < 0) {
        free(rw_old);
        return fail(s, env, sink, 1, -ENOMEM, "transcript", NULL);
    }
    t->recorded = 1;
    kvp_session_rewind_cut(s, rw_old, rw_n);
    int reply_at = s->n_tokens;
    if (t->prefix_len && reply_prefix(s, env, sink) < 0)
        return fail(s, env, sink, 1, -ENOMEM, "transcript", NULL);
    t->gen_start = s->n_tokens;
    t->stats.prompt_tokens = s->n_tokens - s->n_cached;
    if (t->max_prompt > 0 && t->stats.prompt_tokens > t->max_prompt) {
        /* refused before any prefill: its cost grows with the prompt */
        char why[96];
        snprintf(why, sizeof why, "%d tokens to prefill, over the %d of max_prompt_tokens",
                 t->stats.prompt_tokens, t->max_prompt);
        return fail(s, env, sink, 1, -E2BIG, "prompt", why);
    }
    if (!env->reuse_cache) {
        /* Benchmark baseline: forget the cache, run the whole (kept) transcript again. */
        kvp_cache_reset(&s->cache);
        s->n_cached = 0;
        if (s->hist_tokens > 0) {
            restart_tokens(s);
            int rc = kvp_session_retokenize(s, env);
            t->undo_tokens = s->msg_tok[s->n_msgs - 1];   /* in the new rendering */
            if (rc < 0)
                return fail(s, env, sink, 1, rc, "tokenize", NULL);
        }
    }
    t->reply_from = reply_at;
    t->evicted_at_start = s->cache.evicted_rows;
    /* of the whole conversation: the cache holds the dropped history's tokens too */
    t->stats.context_tokens = (int)(s->hist_tokens + s->n_tokens);
    t->stats.cached_tokens = (int)(s->hist_tokens + s->n_cached);
    /* a fork's rows came from another session (until this turn, the only rows it has) */
    t->stats.cached_from = s->n_cached > 0 ? s->reuse_from : KVP_REUSE_OWN;
    s->reuse_from = KVP_REUSE_OWN;
    s->sampler.temperature = t->temperature;
    s->sampler.top_p = t->top_p >= 0 ? t->top_p : env->top_p;
    if (t->has_seed)
        kvp_sampler_seed(&s->sampler, t->seed);
    if (kvp_sampler_set_opts(&s->sampler, &t->sampling) < 0)   /* checked by the hub */
        return fail(s, env, sink, 1, -ENOMEM, "sampler", NULL);
    s->reply_open = 1;    /* the assistant's reply has begun */
    t->state = KVP_TURN_PREFILL;
    return 1;
}

/* A unit run alone, outside any forward pass: a snapshot load (for a hello) or save (at
 * shutdown), then the job event; or a turn's start (turn_start) or end (turn_report).
 * Returns as kvp_turn_step. */
static int run_job(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink)
{
    if (s->state == KVP_SESSION_TURN) {
        int more = 1;
        if (s->turn.state == KVP_TURN_START)
            more = turn_start(s, env, sink);
        if (more && s->turn.end)   /* it failed there: its end follows in the same job */
            more = turn_report(s, env, sink);
        return more;
    }
    char err[256] = "";
    int rc;
    if (s->state == KVP_SESSION_LOAD) {
        /* In memory already (a shared store): only the lease, and the snapshot when
         * another node served the session meanwhile. */
        rc = take_lease(s, env, err, sizeof err);
        if (rc == 0 && s->need_restore)
            rc = kvp_session_restore(s, env, s->reserve, err, sizeof err);
        s->lost = rc == -ENOENT || rc == -EBADMSG;
        if (rc == 0)
            s->need_restore = 0;
    } else {
        rc = kvp_session_save(s, env, err, sizeof err);
        s->saved = rc == 0;
        s->has_snapshot |= rc == 0;
    }
    sink->job(sink->ctx, s, rc, err);
    return 0;
}

/* A started turn's next unit for a batched step: its next prefill chunk or the token
 * sampled last. Returns 1 with the block in q, 0 when the turn ended here (cancelled,
 * nothing to run: reported), ENDED when it ended and its end is a unit of its own
 * (end_turn), NO_ROOM when its chunk does not fit the `room` the step has left: it
 * waits for the next step rather than split the chunk, so its chunks, and so its
 * eviction points, are those of the turn run alone. */
#define NO_ROOM 2
#define ENDED 3
static int plan_unit(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                     int room, kvp_batch_seq *q)
{
    kvp_turn *t = &s->turn;
    if (!t->planned) {   /* its wait for its first step, its start job included */
        t->planned = 1;
        t->stats.queue_ms = (kvp_now() - t->t_start) * 1e3;
    }
    t->evict = evict_cfg(s, env);
    if (atomic_load(&t->cancel))
        return finish(s, env, sink, "cancel") ? ENDED : 0;
    if (t->state == KVP_TURN_DECODE) {
        *q = (kvp_batch_seq){.cache = &s->cache, .tokens = &t->next_token, .n = 1};
        return 1;
    }
    /* KVP_TURN_PREFILL: the next chunk of the transcript not yet run */
    int left = s->n_tokens - s->n_cached;
    int n = left < env->chunk ? left : env->chunk;
    if (n == 0)   /* nothing new to run: no fresh logits to sample from */
        return finish(s, env, sink, "eos") ? ENDED : 0;
    if (n > room)
        return NO_ROOM;
    *q = (kvp_batch_seq){.cache = &s->cache, .tokens = s->tokens + s->n_cached, .n = n};
    return 1;
}

/* Whether the unit's logits are sampled after the step: the block ran and ends the
 * transcript (the prompt's last chunk, or a decoded token). */
static int samples(const kvp_session *s, const kvp_batch_seq *q)
{
    return q->rc >= 0 && s->n_cached + q->n >= s->n_tokens;
}

/* Draws the session's next token from logits (which the sampler overwrites); a canary
 * turn first records the distribution (on failure the record is dropped). */
static int draw_sampled(kvp_session *s, const kvp_session_env *env, float *logits)
{
    kvp_turn *t = &s->turn;
    if (t->canary) {
        int vocab = s->sampler.vocab_size;
        float *copy = malloc((size_t)vocab * sizeof *copy);
        if (copy)
            memcpy(copy, logits, (size_t)vocab * sizeof *copy);
        int tok = kvp_turn_draw(s, env, logits);
        if (!copy || kvp_canary_note(t->canary, s->tokens, s->n_tokens, s->hist_tokens, copy,
                                     vocab, tok) < 0) {
            kvp_canary_rec_free(t->canary);
            t->canary = NULL;
        }
        free(copy);
        return tok;
    }
    return kvp_turn_draw(s, env, logits);
}

/* With logprobs: the raw row is kept before the sampler changes it, and the drawn
 * token's entry (with its alternatives) goes where take_token will count it. */
static int draw(kvp_session *s, const kvp_session_env *env, float *logits)
{
    kvp_turn *t = &s->turn;
    int g = t->stats.generated_tokens;
    if (!t->lp_on || g >= t->lp_cap)
        return draw_sampled(s, env, logits);
    int vocab = s->sampler.vocab_size;
    memcpy(t->lp_row, logits, (size_t)vocab * sizeof *logits);
    int tok = draw_sampled(s, env, logits);
    kvp_hub_logprob *e = t->lp + (size_t)g * (size_t)(1 + t->lp_k);
    kvp_logprob top[KVP_LOGPROBS_MAX_TOP], own;
    int m = kvp_logprobs(t->lp_row, vocab, tok < 0 || tok >= vocab ? 0 : tok, t->lp_k, &own, top);
    int prev = s->n_tokens ? s->tokens[s->n_tokens - 1] : -1;
    for (int j = 0; j <= t->lp_k; j++) {
        kvp_logprob l = j == 0 ? own : j - 1 < m ? top[j - 1] : (kvp_logprob){-1, -INFINITY};
        size_t len = 0;
        const char *p = l.token >= 0 ? kvp_tokenizer_piece(&env->model->tok, prev, l.token, &len)
                                     : NULL;
        e[j] = (kvp_hub_logprob){l.token, l.logprob, p ? p : "", (int)len};
    }
    return tok;
}

typedef struct sample_job {
    kvp_session **ss;
    const int *order, *who;
    kvp_batch_seq *b;
    int *tok;
    const kvp_session_env *env;
} sample_job;

static void sample_item(void *ctx, int j, int slot)
{
    sample_job *sj = ctx;
    kvp_session *s = sj->ss[sj->order[sj->who[j]]];
    (void)slot;
    sj->tok[j] = samples(s, &sj->b[j]) ? draw(s, sj->env, sj->b[j].logits) : -1;
}

/* The unit's result after the step: the block is in the cache; the prompt's last chunk
 * and every decoded token give logits to sample from (tok: drawn already, or -1 to draw
 * here). Returns as kvp_turn_step. */
static int advance_unit(kvp_session *s, const kvp_session_env *env, const kvp_turn_sink *sink,
                        const kvp_batch_seq *q, int tok)
{
    kvp_turn *t = &s->turn;
    int prefill = t->state == KVP_TURN_PREFILL;
    if (q->rc < 0)
        return fail(s, env, sink, prefill, q->rc, prefill ? "prefill" : "decode", NULL);
    s->n_cached += q->n;
    if (prefill)
        t->stats.prefilled_tokens += q->n;
    if (prefill && s->n_cached >= s->n_tokens)
        kvp_policy_mark(s->policy, &s->cache);   /* the reply begins: a rollback point */
    note_rows(s);
    if (s->n_cached < s->n_tokens)
        return 1;
    return take_token(s, env, sink, tok >= 0 ? tok : draw(s, env, q->logits));
}

/* Whether a queued session is a turn that decodes next (one row). */
static int decoding(const kvp_session *s)
{
    return !kvp_session_job_next(s) && s->turn.state == KVP_TURN_DECODE;
}

int kvp_turn_batch(kvp_session **ss, int n, const kvp_session_env *env, kvp_runstate *rs,
                   const kvp_turn_sink *sink, int *more, int *rows)
{
    *rows = 0;
    kvp_batch_seq *b = malloc((size_t)n * sizeof *b);
    const kvp_evict_cfg **e = malloc((size_t)n * sizeof *e);
    int *who = malloc((size_t)n * sizeof *who), *order = malloc((size_t)n * sizeof *order);
    int *unit_more = malloc((size_t)n * sizeof *unit_more);
    char *took = calloc((size_t)n, 1);
    kvp_session **sorted = malloc((size_t)n * sizeof *sorted);
    int *arrival = malloc((size_t)n * sizeof *arrival);
    if (!b || !e || !who || !order || !unit_more || !took || !sorted || !arrival) {
        free(arrival);
        free(b);
        free(e);
        free(who);
        free(order);
        free(unit_more);
        free(took);
        free(sorted);
        return 0;   /* nobody took part: they stay queued for the next step */
    }
    /* Who takes part: first every decoding turn (one row each), so a prompt never holds
     * back the next token of a reply; then each other turn's unit (its next prefill
     * chunk), oldest turn first (by the time its request arrived; queue order among
     * equals), wherever it fits the rows left. A chunk that does not fit is skipped, not
     * split. Under a burst of prompts the oldest ones fill the rows decodes leave, so
     * first tokens come in arrival order and the mean wait is that of a queue served in
     * order, not that of every prompt finishing together; a long prompt still takes one
     * chunk per step, so it cannot hold back the prompts behind it for more than that. */
    for (int i = 0; i < n; i++)
        arrival[i] = i;
    for (int i = 1; i < n; i++) {   /* stable insertion sort of the queue by arrival */
        int v = arrival[i], k = i;
        for (; k > 0 && ss[arrival[k - 1]]->turn.t_start > ss[v]->turn.t_start; k--)
            arrival[k] = arrival[k - 1];
        arrival[k] = v;
    }
    int room = rs->max_tokens, taken = 0, nb = 0;
    for (int pass = 0; pass < 2; pass++)
        for (int q = 0; q < n && room > 0; q++) {
            int i = pass == 0 ? q : arrival[q];
            kvp_session *s = ss[i];
            if (took[i] || decoding(s) != (pass == 0))
                continue;
            int r;
            if (kvp_session_job_next(s) || s->turn.state == KVP_TURN_START) {
                r = run_job(s, env, sink);   /* the scheduler runs these as jobs instead */
            } else if ((r = plan_unit(s, env, sink, room, &b[nb])) == NO_ROOM) {
                continue;
            } else if (r == ENDED) {
                r = 1;   /* no block: its end is its next unit */
            } else if (r) {
                e[nb] = &s->turn.evict;
                room -= b[nb].n;
                who[nb++] = taken;
            }
            took[i] = 1;
            unit_more[taken] = r;
            order[taken++] = i;
        }
    /* One forward step for all of them; each one's failure is its own. */
    if (nb) {
        int rc = kvp_gen_step(env->model, rs, b, e, nb);
        *rows = rs->max_tokens - room;
        /* The samplers of the step on the matmul pool, one session per item (each has
         * its own sampler and logits, so the tokens are those of a serial run); out of
         * memory, each advance_unit draws its own. */
        int *tok = malloc((size_t)nb * sizeof *tok), n_sample = 0;
        for (int j = 0; j < nb; j++) {
            if (rc < 0)
                b[j].rc = rc;
            n_sample += samples(ss[order[who[j]]], &b[j]);
        }
        if (tok) {
            sample_job sj = {ss, order, who, b, tok, env};
            kvp_matmul_enter();
            kvp_matmul_parallel(nb, sample_item, &sj,
                                (size_t)n_sample * (size_t)env->model->cfg.vocab_size * sizeof(float),
                                KVP_MATMUL_MAX_THREADS, 0);
            kvp_matmul_leave();
        }
        for (int j = 0; j < nb; j++)
            unit_more[who[j]] = advance_unit(ss[order[who[j]]], env, sink, &b[j], tok ? tok[j] : -1);
        free(tok);
    }
    /* Those that took part first, in the order they took part, then the others in theirs. */
    for (int k = 0; k < taken; k++) {
        sorted[k] = ss[order[k]];
        more[k] = unit_more[k];
    }
    for (int i = 0, k = taken; i < n; i++)
        if (!took[i])
            sorted[k++] = ss[i];
    memcpy(ss, sorted, (size_t)n * sizeof *ss);
    free(arrival);
    free(b);
    free(e);
    free(who);
    free(order);
    free(unit_more);
    free(took);
    free(sorted);
    return taken;
}

int kvp_turn_step(kvp_session *s, const kvp_session_env *env, kvp_runstate *rs,
                  const kvp_turn_sink *sink)
{
    int more = 0, rows;
    return kvp_turn_batch(&s, 1, env, rs, sink, &more, &rows) ? more : 1;
}
