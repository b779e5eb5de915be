/* The session object: the id table (a hash, the list of every session, the resident
 * list), a session's life in it (create, park, unpark, remove), arming a turn with its
 * options, and the transcript (messages, their tokens, the bounded history and the
 * conversation's hash). No I/O: the turn machine (turns/turn.c) reads and writes the
 * store. */
#include "turns/session.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include "base/checksum.h"
#include "base/textbuf.h"
#include "model/grammar.h"
#include "policy/policy.h"
#include "observe/canary.h"
#include "turns/session_impl.h"

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

/* Loop: frees the buffers of the armed spec and zeroes it, keeping its serial (the next
 * arming's number follows it). */
static void spec_clear(kvp_turn_spec *sp)
{
    free(sp->text);
    for (int i = 0; i < sp->n_stop; i++)
        free(sp->stop[i]);
    free(sp->tools);
    free(sp->prefix);
    free(sp->lp);
    free(sp->lp_row);
    free(sp->lp_ends);
    free((void *)sp->sampling.bias);
    kvp_grammar_unref(sp->gsrc);
    kvp_canary_rec_free(sp->canary);
    uint64_t serial = sp->serial;
    memset(sp, 0, sizeof *sp);
    sp->serial = serial;
}

void kvp_turn_reset(kvp_turn *t)
{
    free(t->reply);
    if (!t->tok_end_lent)
        free(t->tok_end);
    kvp_turn_grammar_free(t);
    uint64_t serial = t->serial;
    memset(t, 0, sizeof *t);
    t->serial = serial;
}

void kvp_session_rewind_clear(kvp_session *s)
{
    for (int i = 0; i < s->rq.rewind_n; i++)
        free(s->rq.rewind_msgs[i].text);
    free(s->rq.rewind_msgs);
    s->rq.rewind_msgs = NULL;
    s->rq.rewind_n = 0;
    s->rq.rewind_set = 0;
    free(s->rq.rewind_tokens);
    free(s->rq.rewind_msg_tok);
    s->rq.rewind_tokens = s->rq.rewind_msg_tok = NULL;
    s->rq.rewind_n_tokens = 0;
}

void kvp_session_turn_ids_clear(kvp_session *s)
{
    free(s->rq.turn_ids);
    s->rq.turn_ids = NULL;
    s->rq.n_turn_ids = 0;
}

void kvp_session_rewind_let_go(kvp_session *s)
{
    s->rq.rewind_msgs = NULL;
    s->rq.rewind_n = 0;
    s->rq.rewind_set = 0;
    s->rq.rewind_tokens = s->rq.rewind_msg_tok = NULL;
    s->rq.rewind_n_tokens = 0;
}

void kvp_session_request_release(kvp_session *s)
{
    free(s->rq.spec.text);   /* the transcript holds its copy */
    s->rq.spec.text = NULL;
    s->rq.spec.text_len = 0;
    if (s->rq.given && s->res.took_rewind)   /* the transcript's now: let go of it */
        kvp_session_rewind_let_go(s);
    if (s->rq.given && s->res.took_turn_ids)
        s->rq.turn_ids = NULL;
    kvp_session_rewind_clear(s);
    kvp_session_turn_ids_clear(s);
    s->rq.reuse_from = KVP_REUSE_OWN;
    s->rq.given = 0;
}

static void session_free(kvp_session *s)
{
    kvp_cache_free(&s->cache);
    if (s->policy)   /* before the conf: it may read the conf's shared weights */
        kvp_policy_destroy(s->policy);
    kvp_policy_conf_unref(s->pconf);
    kvp_sampler_free(&s->sampler);
    free(s->tokens);
    free(s->raw_ids);
    for (int i = 0; i < s->n_msgs; i++)
        free(s->msgs[i].text);
    free(s->msgs);
    free(s->msg_tok);
    free(s->system);
    kvp_session_request_release(s);   /* a turn's end that never came back included */
    spec_clear(&s->rq.spec);
    kvp_turn_reset(&s->turn);
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
    spec_clear(&s->rq.spec);
    kvp_turn_reset(&s->turn);   /* the last turn's buffers (the worker's, not busy now) */
    s->reply_open = 0;
    s->state = KVP_SESSION_PARKED;
    s->bytes = s->shared_bytes = s->borrowed_bytes = 0;
    s->shares = 0;
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

int kvp_session_begin_turn(kvp_session *s, const char *text, size_t len, int max_tokens,
                           float temperature, int budget, double now)
{
    kvp_turn_spec *sp = &s->rq.spec;
    spec_clear(sp);
    sp->serial++;   /* armed: its start (turn_start) is the session's next unit */
    sp->text = malloc(len + 1);
    if (!sp->text)
        return -ENOMEM;
    memcpy(sp->text, text, len);
    sp->text[len] = '\0';
    sp->text_len = len;
    sp->max_tokens = max_tokens;
    sp->temperature = temperature;
    sp->top_p = -1;
    sp->budget = budget;
    atomic_store(&s->rq.cancel, 0);
    sp->t_start = now;
    return 0;
}

/* The logprob buffers' sizes for a turn of max_tokens tokens with `top` alternatives
 * (top < 0: none): entries (lp), the logits row (lp_row), the tokens' ends (tok_end);
 * returns their sum. */
static size_t lp_sizes(int max_tokens, int vocab, int top, size_t *lp, size_t *row,
                       size_t *ends)
{
    *lp = *row = *ends = 0;
    if (top < 0 || vocab <= 0 || max_tokens <= 0)
        return 0;
    int k = top < vocab ? top : vocab;
    *lp = (size_t)max_tokens * (size_t)(1 + k) * sizeof(kvp_hub_logprob);
    *row = (size_t)vocab * sizeof(float);
    *ends = (size_t)max_tokens * sizeof(size_t);
    return *lp + *row + *ends;
}

size_t kvp_session_logprobs_bytes(int max_tokens, int vocab, int top)
{
    size_t lp, row, ends;
    return lp_sizes(max_tokens, vocab, top, &lp, &row, &ends);
}

int kvp_session_turn_logprobs(kvp_session *s, int vocab, int top)
{
    kvp_turn_spec *sp = &s->rq.spec;
    if (top < 0)
        return 0;
    if (top > KVP_LOGPROBS_MAX_TOP || vocab <= 0 || sp->max_tokens <= 0)
        return -EINVAL;
    int k = top < vocab ? top : vocab;
    size_t lp_bytes, row_bytes, end_bytes;
    lp_sizes(sp->max_tokens, vocab, top, &lp_bytes, &row_bytes, &end_bytes);
    sp->lp = malloc(lp_bytes);
    sp->lp_row = malloc(row_bytes);
    /* each token's end in the reply, so token events and a stop string's cut know which
     * tokens' text is out (made here, never grown in the step) */
    sp->lp_ends = malloc(end_bytes);
    if (!sp->lp || !sp->lp_row || !sp->lp_ends) {
        free(sp->lp);
        free(sp->lp_row);
        free(sp->lp_ends);
        sp->lp = NULL;
        sp->lp_row = NULL;
        sp->lp_ends = NULL;
        return -ENOMEM;
    }
    sp->lp_on = 1;
    sp->lp_k = k;
    sp->lp_cap = sp->max_tokens;
    return 0;
}

int kvp_session_turn_stops(kvp_session *s, const char *const *stop, const size_t *len, int n)
{
    kvp_turn_spec *sp = &s->rq.spec;
    if (n < 0 || n > KVP_HUB_MAX_STOPS)
        return -EINVAL;
    for (int i = 0; i < n; i++)
        if (len[i] < 1 || len[i] > KVP_HUB_STOP_MAX)
            return -EINVAL;
    for (int i = 0; i < n; i++) {
        if (!(sp->stop[i] = malloc(len[i])))
            return -ENOMEM;   /* spec_clear frees the ones made */
        memcpy(sp->stop[i], stop[i], len[i]);
        sp->stop_len[i] = len[i];
        sp->n_stop = i + 1;
        if (len[i] - 1 > sp->stop_hold)
            sp->stop_hold = len[i] - 1;
    }
    return 0;
}

int kvp_session_turn_tools(kvp_session *s, const kvp_turn_opts *o)
{
    kvp_turn_spec *sp = &s->rq.spec;
    sp->role = o->role == KVP_MESSAGE_TOOL ? KVP_MESSAGE_TOOL : 1;
    if (o->tools_len && !(sp->tools = kvp_text_dup(o->tools, o->tools_len)))
        return -ENOMEM;
    sp->tools_len = o->tools_len;
    if (o->reply_prefix_len && !(sp->prefix = kvp_text_dup(o->reply_prefix, o->reply_prefix_len)))
        return -ENOMEM;
    sp->prefix_len = o->reply_prefix_len;
    sp->prefill = o->prefill && o->reply_prefix_len;
    if (o->end_after_len && sp->n_stop <= KVP_HUB_MAX_STOPS) {
        int i = sp->n_stop;
        if (!(sp->stop[i] = kvp_text_dup(o->end_after, o->end_after_len)))
            return -ENOMEM;
        sp->stop_len[i] = o->end_after_len;
        sp->stop_keep[i] = 1;
        sp->n_stop = i + 1;
        if (o->end_after_len - 1 > sp->stop_hold)
            sp->stop_hold = o->end_after_len - 1;
    }
    return 0;
}

int kvp_session_turn_sampling(kvp_session *s, const kvp_sample_opts *o)
{
    kvp_turn_spec *sp = &s->rq.spec;
    const char *field;
    if (kvp_sample_opts_check(o, s->sampler.vocab_size, &field) < 0)
        return -EINVAL;
    kvp_logit_bias *b = NULL;
    if (o->n_bias && !(b = malloc((size_t)o->n_bias * sizeof *b)))
        return -ENOMEM;
    if (b)
        memcpy(b, o->bias, (size_t)o->n_bias * sizeof *b);
    free((void *)sp->sampling.bias);
    sp->sampling = *o;
    sp->sampling.bias = b;
    return 0;
}

int kvp_session_push_token(kvp_session *s, int id)
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

/* With the model's own Jinja template (kvp_template_jinja_turn): the whole conversation
 * with the new user message rendered, the transcript kept as far as the rendering agrees
 * with it. Where the template renders an earlier turn differently now (Qwen3 drops an
 * earlier reply's think block), the transcript and the cache go back to the longest
 * shared prefix (the journal's next save is a full one) and the rest is prefilled anew.
 * *ids (malloc'd) are the tokens to append. Returns their count, or -ENOENT when the
 * family renders this turn: no Jinja template, dropped history (the rendering would
 * start at the conversation's beginning), or a conversation the template refuses. */
int kvp_session_jinja_turn(kvp_session *s, const kvp_session_env *env, int **ids)
{
    const kvp_turn_spec *sp = &s->rq.spec;
    kvp_turn *t = &s->turn;
    if (!env->tpl.jinja || s->hist_tokens != 0 || s->raw)
        return -ENOENT;
    kvp_chat_msg *cm = malloc(sizeof *cm * ((size_t)s->n_msgs + 2));
    if (!cm)
        return -ENOMEM;
    for (int i = 0; i < s->n_msgs; i++)
        cm[i] = (kvp_chat_msg){s->msgs[i].user, s->msgs[i].text, s->msgs[i].len};
    cm[s->n_msgs] = (kvp_chat_msg){sp->role ? sp->role : 1, sp->text, sp->text_len};
    int common = 0, n;
    if (sp->prefill) {
        /* the assistant's unfinished message too: the rendering is cut where it ends */
        cm[s->n_msgs + 1] = (kvp_chat_msg){0, sp->prefix, sp->prefix_len};
        int at = 0;
        n = kvp_template_jinja_prefill(&env->tpl, s->system, s->system_len, cm, s->n_msgs + 2,
                                       sp->tools, sp->tools_len, s->tokens, s->n_tokens, &common,
                                       &at, ids, NULL, 0);
        t->prefill_at = at;
    } else {
        n = kvp_template_jinja_turn_tools(&env->tpl, s->system, s->system_len, cm,
                                          s->n_msgs + 1, sp->tools, sp->tools_len, s->tokens,
                                          s->n_tokens, s->jinja_rendered, &common, ids);
    }
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
    /* A prefill's tokens are the assistant message as the template renders it last (Qwen3
     * with an empty think block), which need not be how it renders that message once a
     * user message follows: the next turn compares from scratch. */
    s->jinja_rendered = !sp->prefill;
    return n;
}

int kvp_session_seed(kvp_session *s, const kvp_message *msgs, int n)
{
    /* no tokens yet: the first turn renders them (kvp_session_retokenize) */
    for (int i = 0; i < n; i++)
        if (kvp_session_push_message(s, msgs[i].user, msgs[i].text, msgs[i].len, 0) < 0)
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
int kvp_session_push_message(kvp_session *s, int user, const char *text, size_t len, int first)
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
void kvp_session_bound_history(kvp_session *s, int max)
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
void kvp_session_restart_tokens(kvp_session *s)
{
    if (s->hist_tokens == 0)
        return;
    s->n_tokens = 0;
    s->hist_tokens = 0;
    for (int i = 0; i < s->n_msgs; i++)
        s->msg_tok[i] = 0;   /* none rendered yet */
    s->journal_ok = 0;   /* other tokens than on disk: the next save is a full one */
}

void kvp_session_count_bytes(kvp_session *s)
{
    s->bytes = kvp_cache_bytes(&s->cache);
    s->shared_bytes = kvp_cache_shared_bytes(&s->cache);
    s->borrowed_bytes = kvp_cache_borrowed_bytes(&s->cache);
    s->shares = s->borrowed_bytes > 0;
}
