/* POST /v1/completions (docs/openai.md): OpenAI's legacy text completion. `prompt` (one
 * string) in, `text` out, whole (`text_completion`) or streamed as Server-Sent Events
 * (`text_completion` chunks, then `data: [DONE]`). `logprobs: N` (0..20) gives each
 * token's log-probability and its N most likely alternatives in the legacy shape
 * (tokens, token_logprobs, top_logprobs, text_offset in bytes from the prompt's start).
 * The sampling fields, `max_tokens`,
 * `stop`, `seed` and `stream_options` are the chat completion's (kvpd_oai_options). The
 * prompt goes to kvp_hub_complete, which continues the session whose texts it extends,
 * so a prompt that repeats an earlier prompt and its completion reuses that cache (on a
 * model without a chat template; with one, the prompt runs in a session of its own,
 * tokenized without the template, and is prefilled whole).
 * POST /completion is llama.cpp's server's own form of the same request (below): its
 * fields are read into the same options and it starts the same raw prompt. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/parse.h"
#include "base/textbuf.h"
#include "base/utf8.h"
#include "web/openai_impl.h"

static json_t *chunk(const kvpd_oai *o, const char *text, size_t len, const char *finish)
{
    return json_pack("{s:s, s:s, s:I, s:s, s:[{s:s%, s:i, s:n, s:s?}]}", "id", o->id,
                     "object", "text_completion", "created", (json_int_t)o->created, "model",
                     o->model, "choices", "text", text, len, "index", 0, "logprobs",
                     "finish_reason", finish);
}

static void start(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    o->started = 1;
    o->status = 200;
}

/* With logprobs: the choice's logprobs in the legacy shape, of n tokens from lp. */
static json_t *with_logprobs(kvpd_oai *o, json_t *j, const kvp_hub_event *ev, int from, int n)
{
    if (!o->req.turn.logprobs)
        return j;
    json_t *choice = json_array_get(json_object_get(j, "choices"), 0);
    const kvp_hub_logprob *lp = ev->logprobs ? ev->logprobs + (size_t)from * (size_t)(1 + ev->logprobs_top)
                                             : NULL;
    if (choice)
        json_object_set_new(choice, "logprobs",
                            kvpd_oai_logprobs_legacy(lp, lp ? n : 0, ev->logprobs_top,
                                                     &o->req.lp_offset));
    return j;
}

static void token(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    if (!o->req.stream || !ev->len)
        return;
    start(c);
    json_t *j = with_logprobs(o, chunk(o, ev->text, ev->len, NULL), ev, 0, ev->n_logprobs);
    o->req.lp_sent += ev->n_logprobs;
    kvpd_oai_sse(c, NULL, j);
}

static void done(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    const kvp_turn_stats *st = ev->stats;
    const char *finish = kvpd_oai_finish_reason(st, 0);
    if (!o->req.stream) {
        json_t *j = with_logprobs(o, chunk(o, ev->text, ev->len, finish), ev, 0, ev->n_logprobs);
        json_object_set_new(j, "usage", kvpd_oai_usage(st));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(kvpd_oai_shown_session(o), o->durable, st));
        kvpd_oai_answer(c, 200, j);
        return;
    }
    start(c);
    int rest = ev->n_logprobs - o->req.lp_sent;   /* tokens whose text came before */
    kvpd_oai_sse(c, NULL, with_logprobs(o, chunk(o, "", 0, finish), ev, o->req.lp_sent,
                                        rest > 0 ? rest : 0));
    if (o->req.include_usage) {
        json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", o->id, "object",
                              "text_completion", "created", (json_int_t)o->created, "model",
                              o->model, "choices");
        json_object_set_new(j, "usage", kvpd_oai_usage(st));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(kvpd_oai_shown_session(o), o->durable, st));
        kvpd_oai_sse(c, NULL, j);
    }
    kvpd_oai_queue(c, "data: [DONE]\n\n", 14);
    o->ended = 1;
}

static const kvpd_oai_codec codec = {.token = token, .done = done};

/* The one way both endpoints start a raw prompt: text[0..len), or ids[0..n) when ids is
 * not NULL, in the hub's raw completion. */
static void run(kvpd_conn *c, const char *text, size_t len, const int *ids, int n,
                const kvp_turn_opts *t)
{
    kvp_hub_client *hc = kvpd_oai_client(c);
    if (hc && ids)
        kvp_hub_complete_tokens(hc, ids, n, t);
    else if (hc)
        kvp_hub_complete(hc, text, len, t);
}

/* Fields of the completions API kvpd cannot honour: the first one present, or NULL. */
static const char *refused(json_t *req)
{
    json_t *v = json_object_get(req, "echo");
    if (v && !json_is_null(v) && !json_is_false(v))
        return "echo";
    v = json_object_get(req, "suffix");
    if (v && !json_is_null(v) && !(json_is_string(v) && json_string_length(v) == 0))
        return "suffix";
    v = json_object_get(req, "best_of");
    if (v && !json_is_null(v) && !(json_is_integer(v) && json_integer_value(v) == 1))
        return "best_of";
    v = json_object_get(req, "top_logprobs");   /* chat's: here logprobs is the count */
    if (v && !json_is_null(v))
        return "top_logprobs";
    /* chat completions' fields, which a text completion has no place for */
    static const char *chat_only[] = {"tools", "tool_choice", "parallel_tool_calls",
                                      "response_format"};
    for (size_t i = 0; i < sizeof chat_only / sizeof chat_only[0]; i++)
        if ((v = json_object_get(req, chat_only[i])) && !json_is_null(v))
            return chat_only[i];
    return NULL;
}

void kvpd_oai_completions(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    json_t *req = kvpd_oai_parse(c);
    if (!req)
        return;
    kvpd_oai_new_id(o->id, sizeof o->id, "cmpl-");
    o->codec = &codec;
    kvp_turn_opts t;
    char msg[256];
    const char *field = refused(req);
    if (field) {
        snprintf(msg, sizeof msg, "%s is not supported by kvpd%s", field,
                 !strcmp(field, "echo") ? " (only echo: false)" : "");
        kvpd_oai_fail(c, KVPD_OAI_E_UNSUPPORTED_PARAMETER, field, msg);
        goto out;
    }
    kvpd_oai_err fe;
    if (kvpd_oai_check_fields(req, KVPD_OAI_API_COMPLETIONS, &fe) < 0) {
        kvpd_oai_fail(c, fe.code, fe.param, fe.message);
        goto out;
    }
    if (kvpd_oai_model_ok(c, req) < 0 || kvpd_oai_options(c, req, &t) < 0)
        goto out;
    /* logprobs: N, the legacy form: each token's logprob and its N most likely */
    json_t *lp = json_object_get(req, "logprobs");
    if (lp && !json_is_null(lp)) {
        if (!json_is_integer(lp) || json_integer_value(lp) < 0 ||
            json_integer_value(lp) > KVP_LOGPROBS_MAX_TOP) {
            snprintf(msg, sizeof msg, "logprobs must be an integer from 0 to %d",
                     KVP_LOGPROBS_MAX_TOP);
            kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "logprobs", msg);
            goto out;
        }
        t.logprobs = o->req.turn.logprobs = 1;
        t.top_logprobs = o->req.turn.top_logprobs = (int)json_integer_value(lp);
    }
    /* One prompt: a string, or an array holding one string. Token ids and several
     * prompts (one choice each) are not served. */
    json_t *p = json_object_get(req, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (!json_is_string(p)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "prompt", json_is_array(p)
                      ? "prompt must be one string: arrays of token ids and several prompts "
                        "are not supported by kvpd"
                      : "prompt must be a string");
        goto out;
    }
    if (json_string_length(p) == 0) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "prompt", "prompt must not be empty");
        goto out;
    }
    o->req.lp_offset = json_string_length(p);   /* text_offset counts from the prompt's start */
    run(c, json_string_value(p), json_string_length(p), NULL, 0, &t);
out:
    json_decref(req);
}

/* ---- POST /completion (llama.cpp's server; docs/openai.md) ---- */

typedef struct llama_state {
    json_t *settings;          /* generation_settings of the answer */
    char *prompt;              /* the prompt's text, as the answer echoes it */
    size_t prompt_len;
    char *stops[KVP_HUB_MAX_STOPS];
    int n_stops;
    int return_tokens;         /* the whole answer lists the reply's token ids */
    int n_probs;               /* each token's logprob and its n_probs most likely */
    int ignore_eos;            /* EOS banned (a logit bias) */
    json_t *fields;            /* response_fields: the answer holds only these paths */
} llama_state;

static void llama_free(void *p)
{
    llama_state *ls = p;
    if (!ls)
        return;
    json_decref(ls->settings);
    json_decref(ls->fields);
    free(ls->prompt);
    for (int i = 0; i < ls->n_stops; i++)
        free(ls->stops[i]);
    free(ls);
}

json_t *kvpd_oai_llama_params(const kvpd_config *cfg, const kvp_turn_opts *t, int n_predict,
                              int stream)
{
    kvp_turn_opts none = {0};
    if (!t)
        t = &none;
    json_t *stop = json_array();
    for (int i = 0; stop && i < t->n_stop; i++)
        json_array_append_new(stop, json_stringn(t->stop[i], t->stop_len[i]));
    const kvp_sample_opts *so = &t->sampling;
    /* llama.cpp's form: [{"bias", "token"}], a ban's bias null (its -inf) */
    json_t *bias = json_array();
    for (int i = 0; bias && i < so->n_bias; i++)
        json_array_append_new(bias, json_pack("{s:o, s:i}", "bias",
                                              so->bias[i].bias <= KVP_SAMPLER_BAN_BIAS
                                              ? json_null() : json_real(so->bias[i].bias),
                                              "token", so->bias[i].token));
    return json_pack("{s:i, s:I, s:f, s:i, s:f, s:f, s:f, s:f, s:f, s:o, s:b, s:o, s:i}",
                     "n_predict", n_predict, "seed",
                     t->has_seed ? (json_int_t)t->seed : (json_int_t)-1,
                     "temperature", (double)(t->has_temperature ? t->temperature : cfg->temperature),
                     "top_k", so->top_k,
                     "top_p", (double)(t->has_top_p ? t->top_p : cfg->top_p),
                     "min_p", (double)so->min_p,
                     "repeat_penalty", so->repetition_penalty > 0 ? (double)so->repetition_penalty : 1.0,
                     "presence_penalty", (double)so->presence_penalty,
                     "frequency_penalty", (double)so->frequency_penalty, "stop", stop,
                     "stream", stream, "logit_bias", bias, "n_probs", t->top_logprobs);
}

/* llama.cpp's stop_type for kvpd's stop. */
static const char *stop_type(const char *stop)
{
    return !strcmp(stop, "eos") ? "eos" : !strcmp(stop, "length") ? "limit"
         : !strcmp(stop, "stop") ? "word" : "none";
}

/* The ids of n reply tokens from the event's logprobs (each with top alternatives). */
static json_t *token_ids(const kvp_hub_logprob *lp, int n, int top)
{
    json_t *a = json_array();
    for (int i = 0; a && lp && i < n; i++)
        json_array_append_new(a, json_integer(lp[(size_t)i * (size_t)(1 + top)].token));
    return a;
}

/* llama.cpp's completion_probabilities of n reply tokens: [{id, token, bytes, logprob,
 * top_logprobs: [{id, token, bytes, logprob}]}], the chat completions' entries with ids. */
static json_t *llama_probs(const kvp_hub_logprob *lp, int n, int top)
{
    json_t *a = json_array();
    for (int i = 0; a && lp && i < n; i++) {
        const kvp_hub_logprob *e = lp + (size_t)i * (size_t)(1 + top);
        json_t *one = kvpd_oai_logprobs_content(e, 1, top);
        json_t *entry = json_incref(json_array_get(one, 0));
        json_decref(one);
        if (!entry)
            continue;
        json_object_set_new(entry, "id", json_integer(e->token));
        json_t *alts = json_object_get(entry, "top_logprobs");
        size_t k = 0;
        for (int j = 1; j <= top; j++)   /* the alternatives it lists: those with a token */
            if (e[j].token >= 0)
                json_object_set_new(json_array_get(alts, k++), "id", json_integer(e[j].token));
        json_array_append_new(a, entry);
    }
    return a;
}

/* response_fields: an object of the paths asked for ("a/b" is j["a"]["b"]), each under
 * its path, those the answer has. Takes j. */
static json_t *only_fields(json_t *j, json_t *fields)
{
    json_t *out = json_object();
    size_t i;
    json_t *f;
    json_array_foreach(fields, i, f) {
        const char *path = json_string_value(f);
        json_t *v = j;
        for (const char *p = path; v && *p;) {
            const char *slash = strchr(p, '/');
            size_t n = slash ? (size_t)(slash - p) : strlen(p);
            v = json_object_getn(v, p, n);
            p += n + (slash != NULL);
        }
        if (v && out)
            json_object_set(out, path, v);
    }
    json_decref(j);
    return out;
}

/* The final object: content (the whole reply; "" at a stream's end), the figures and
 * the tokens of lp[0..n) (their ids with return_tokens, their logprobs with n_probs). */
static json_t *llama_final(kvpd_conn *c, const char *text, size_t len, const kvp_turn_stats *st,
                           const kvp_hub_logprob *lp, int n, int top)
{
    kvpd_oai *o = c->oai;
    llama_state *ls = o->codec_state;
    const char *word = st->stop_word >= 0 && st->stop_word < ls->n_stops && !strcmp(st->stop, "stop")
                       ? ls->stops[st->stop_word] : "";
    double prompt_ms = st->ttft_ms, gen_ms = st->duration_ms - st->ttft_ms;
    if (gen_ms < 0)
        gen_ms = 0;
    json_t *timings = json_pack(
        "{s:i, s:i, s:f, s:f, s:f, s:i, s:f, s:f, s:f}", "cache_n", st->cached_tokens,
        "prompt_n", st->prefilled_tokens,
        "prompt_ms", prompt_ms, "prompt_per_token_ms",
        st->prefilled_tokens ? prompt_ms / st->prefilled_tokens : 0.0, "prompt_per_second",
        prompt_ms > 0 ? st->prefilled_tokens * 1e3 / prompt_ms : 0.0,
        "predicted_n", st->generated_tokens, "predicted_ms", gen_ms, "predicted_per_token_ms",
        st->generated_tokens ? gen_ms / st->generated_tokens : 0.0, "predicted_per_second",
        gen_ms > 0 ? st->generated_tokens * 1e3 / gen_ms : 0.0);
    json_t *settings = json_deep_copy(ls->settings);
    json_t *j = json_pack(
        "{s:i, s:s%, s:b, s:s, s:i, s:i, s:i, s:o, s:s%, s:b, s:b, s:s, s:s, s:i, s:o}",
        "index", 0, "content", text, len, "stop", 1, "model", o->model, "id_slot", -1,
        "tokens_predicted", st->generated_tokens, "tokens_evaluated", st->context_tokens,
        "generation_settings", settings ? settings : json_object(), "prompt", ls->prompt,
        ls->prompt_len, "has_new_line", memchr(text, '\n', len) != NULL, "truncated", 0,
        "stop_type", stop_type(st->stop), "stopping_word", word, "tokens_cached",
        st->context_tokens + st->generated_tokens, "timings", timings);
    if (j) {
        json_object_set_new(j, "tokens", ls->return_tokens ? token_ids(lp, n, top) : json_array());
        if (ls->n_probs)
            json_object_set_new(j, "completion_probabilities", llama_probs(lp, n, top));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(NULL, o->durable, st));
    }
    if (j && ls->fields)
        j = only_fields(j, ls->fields);
    return j;
}

static void llama_token(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    if (!o->req.stream || !ev->len)
        return;
    start(c);
    /* as llama.cpp's chunks: the ids of the tokens whose text is now whole */
    json_t *j = json_pack("{s:i, s:s%, s:o, s:b, s:i}", "index", 0, "content", ev->text, ev->len,
                          "tokens", token_ids(ev->logprobs, ev->n_logprobs, ev->logprobs_top),
                          "stop", 0, "id_slot", -1);
    llama_state *ls = o->codec_state;
    if (j && ls->n_probs)
        json_object_set_new(j, "completion_probabilities",
                            llama_probs(ev->logprobs, ev->n_logprobs, ev->logprobs_top));
    o->req.lp_sent += ev->n_logprobs;
    kvpd_oai_sse(c, NULL, j);
}

static void llama_done(kvpd_conn *c, const kvp_hub_event *ev)
{
    kvpd_oai *o = c->oai;
    if (!o->req.stream) {
        kvpd_oai_answer(c, 200, llama_final(c, ev->text, ev->len, ev->stats, ev->logprobs,
                                            ev->n_logprobs, ev->logprobs_top));
        return;
    }
    start(c);   /* llama.cpp's stream ends with the stop chunk: no [DONE] */
    int rest = ev->n_logprobs - o->req.lp_sent;   /* tokens whose text came before */
    kvpd_oai_sse(c, NULL, llama_final(c, "", 0, ev->stats,
                                      ev->logprobs ? ev->logprobs + (size_t)o->req.lp_sent *
                                                     (size_t)(1 + ev->logprobs_top) : NULL,
                                      rest > 0 ? rest : 0, ev->logprobs_top));
    o->ended = 1;
}

static void llama_stream_error(kvpd_conn *c, enum kvpd_oai_code code, const char *msg,
                               size_t len)
{
    kvpd_oai_sse(c, NULL, kvpd_oai_error_json(code, NULL, msg, len));
}

static const kvpd_oai_codec llama_codec = {.token = llama_token, .done = llama_done,
                                           .stream_error = llama_stream_error,
                                           .free = llama_free};

/* Fields of llama.cpp's /completion kvpd takes only at the value that changes nothing
 * (llama.cpp's neutral value): another value is refused naming the field. */
static const struct {
    const char *name;
    double neutral;            /* a number, or for booleans 0 (false) */
    int boolean;
} neutral[] = {
    {"id_slot", -1, 0}, {"typical_p", 1, 0}, {"mirostat", 0, 0},
    {"dynatemp_range", 0, 0}, {"xtc_probability", 0, 0}, {"dry_multiplier", 0, 0},
    {"n_keep", 0, 0}, {"timings_per_token", 0, 1}, {"post_sampling_probs", 0, 1},
};

/* Fields read as the OpenAI completion's, under the same name. */
static const char *const same[] = {"temperature", "top_k", "top_p", "min_p",
                                   "presence_penalty", "frequency_penalty", "stop", "stream",
                                   "json_schema"};

/* A logit_bias entry's key: a token id, or a text whose tokens all take the bias (as
 * llama.cpp's server reads a string there). Sets lb[id] = bias for each; 0, or -1 when
 * key is neither (or too many). */
static int bias_key(kvpd_conn *c, json_t *key, double bias, json_t *lb)
{
    int *ids = NULL, n = 0;
    long id;
    char buf[24];
    if (json_is_integer(key) && json_integer_value(key) >= 0) {
        snprintf(buf, sizeof buf, "%lld", (long long)json_integer_value(key));
        return json_object_set_new(lb, buf, json_real(bias));
    }
    if (!json_is_string(key) || json_string_length(key) == 0)
        return -1;
    const char *k = json_string_value(key);
    if (kvp_parse_long(k, 0, 1L << 30, &id))   /* the OpenAI form's "id" */
        return json_object_set_new(lb, k, json_real(bias));
    if (json_string_length(key) > KVP_HUB_STOP_MAX ||
        (n = kvp_hub_tokenize(c->w->hub, k, json_string_length(key), 0, &ids)) <= 0) {
        free(ids);
        return -1;
    }
    int rc = 0;
    for (int i = 0; i < n && !rc; i++) {
        snprintf(buf, sizeof buf, "%d", ids[i]);
        rc = json_object_set_new(lb, buf, json_real(bias));
    }
    free(ids);
    return rc || json_object_size(lb) > KVP_SAMPLER_MAX_BIAS ? -1 : 0;
}

/* A boolean field of llama.cpp's (null: false); -1 when it is not one. */
static int llama_bool(json_t *v)
{
    return json_is_null(v) ? 0 : json_is_boolean(v) ? json_is_true(v) : -1;
}

/* Copies and checks llama.cpp's request into the OpenAI completion's options (oai, a new
 * object) and the answer's shape (ls). NULL, or the field refused with its code and
 * message. */
static const char *llama_translate(kvpd_conn *c, json_t *req, json_t *oai, llama_state *ls,
                                   enum kvpd_oai_code *code, char *msg, size_t msglen)
{
    const char *key;
    json_t *v;
    *code = KVPD_OAI_E_INVALID_REQUEST;
    json_object_foreach(req, key, v) {
        int known = !strcmp(key, "prompt") || !strcmp(key, "model") ||
                    !strcmp(key, "cache_prompt");
        for (size_t i = 0; !known && i < sizeof same / sizeof same[0]; i++)
            if (!strcmp(key, same[i])) {
                known = 1;
                json_object_set(oai, key, v);
            }
        for (size_t i = 0; !known && i < sizeof neutral / sizeof neutral[0]; i++) {
            if (strcmp(key, neutral[i].name))
                continue;
            known = 1;
            int ok = json_is_null(v) ||
                     (neutral[i].boolean ? json_is_false(v)
                                         : json_is_number(v) && json_number_value(v) == neutral[i].neutral);
            if (!ok) {
                *code = KVPD_OAI_E_UNSUPPORTED_PARAMETER;
                if (neutral[i].boolean)
                    snprintf(msg, msglen, "%s is not supported by kvpd (only false)", key);
                else
                    snprintf(msg, msglen, "%s is not supported by kvpd (only %g)", key,
                             neutral[i].neutral);
                return key;
            }
        }
        if (known)
            continue;
        if (!strcmp(key, "return_tokens") || !strcmp(key, "ignore_eos")) {
            int b = llama_bool(v);
            if (b < 0) {
                snprintf(msg, msglen, "%s must be a boolean", key);
                return key;
            }
            *(!strcmp(key, "ignore_eos") ? &ls->ignore_eos : &ls->return_tokens) = b;
        } else if (!strcmp(key, "n_probs")) {
            if (!json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) < 0 ||
                                     json_integer_value(v) > KVP_LOGPROBS_MAX_TOP)) {
                snprintf(msg, msglen, "n_probs must be an integer from 0 to %d",
                         KVP_LOGPROBS_MAX_TOP);
                return key;
            }
            ls->n_probs = json_is_integer(v) ? (int)json_integer_value(v) : 0;
        } else if (!strcmp(key, "response_fields")) {
            size_t i;
            json_t *f;
            int ok = json_is_array(v) || json_is_null(v);
            json_array_foreach(v, i, f)
                ok = ok && json_is_string(f) && json_string_length(f) > 0;
            if (!ok) {
                snprintf(msg, msglen, "response_fields must be an array of field paths");
                return key;
            }
            if (json_array_size(v)) {
                if (json_is_true(json_object_get(req, "stream"))) {
                    *code = KVPD_OAI_E_UNSUPPORTED_PARAMETER;
                    snprintf(msg, msglen, "response_fields is not supported by kvpd with "
                             "stream (it shapes the whole answer only)");
                    return key;
                }
                json_decref(ls->fields);
                ls->fields = json_incref(v);
            }
        } else if (!strcmp(key, "n_predict") || !strcmp(key, "max_tokens")) {
            /* -1: no limit of its own (the ceiling) */
            if (!json_is_integer(v) || json_integer_value(v) < -1 || json_integer_value(v) > 1 << 30) {
                snprintf(msg, msglen, "%s must be an integer: -1 (no limit) or a count of "
                         "tokens", key);
                return key;
            }
            if (json_integer_value(v) == 0) {
                *code = KVPD_OAI_E_UNSUPPORTED_PARAMETER;
                snprintf(msg, msglen, "%s 0 is not supported by kvpd: a completion has at "
                         "least one token", key);
                return key;
            }
            if (json_integer_value(v) > 0 &&
                (!strcmp(key, "n_predict") || !json_object_get(req, "n_predict")))
                json_object_set(oai, "max_tokens", v);
        } else if (!strcmp(key, "seed")) {
            /* -1 (and llama.cpp's 0xFFFFFFFF): a random seed, as without one */
            if (!json_is_null(v) && (!json_is_integer(v) || json_integer_value(v) < -1)) {
                snprintf(msg, msglen, "seed must be an integer (-1: random)");
                return key;
            }
            if (json_is_integer(v) && json_integer_value(v) != -1 &&
                json_integer_value(v) != 0xFFFFFFFF)
                json_object_set(oai, "seed", v);
        } else if (!strcmp(key, "repeat_penalty")) {
            if (!json_is_null(v) && (!json_is_number(v) || !(json_number_value(v) > 0) ||
                                     json_number_value(v) > 10)) {
                snprintf(msg, msglen, "repeat_penalty must be a number above 0, at most 10");
                return key;
            }
            json_object_set(oai, "repetition_penalty", v);
        } else if (!strcmp(key, "repeat_last_n")) {
            /* kvpd's repetition penalty counts the reply's tokens, not the last n */
            json_t *rp = json_object_get(req, "repeat_penalty");
            if (!json_is_integer(v)) {
                snprintf(msg, msglen, "repeat_last_n must be an integer");
                return key;
            }
            if (rp && !json_is_null(rp) && !(json_is_number(rp) && json_number_value(rp) == 1)) {
                *code = KVPD_OAI_E_UNSUPPORTED_PARAMETER;
                snprintf(msg, msglen, "repeat_last_n is not supported by kvpd with a "
                         "repeat_penalty (it penalizes the reply's own tokens)");
                return key;
            }
        } else if (!strcmp(key, "logit_bias")) {
            /* [[id or text, bias or false], ...] (false: never) or {"id or text": bias} */
            json_t *lb = json_object();
            size_t i = 0;
            json_t *e;
            const char *k;
            int ok = lb && (json_is_object(v) || json_is_array(v) || json_is_null(v));
            json_object_foreach(v, k, e) {
                json_t *kj = json_string(k);
                ok = ok && json_is_number(e) && bias_key(c, kj, json_number_value(e), lb) == 0;
                json_decref(kj);
            }
            json_array_foreach(v, i, e) {
                json_t *b = json_array_get(e, 1);
                ok = ok && json_is_array(e) && json_array_size(e) == 2 &&
                     (json_is_number(b) || json_is_false(b)) &&
                     bias_key(c, json_array_get(e, 0),
                              json_is_false(b) ? -100.0 : json_number_value(b), lb) == 0;
            }
            if (!ok) {
                json_decref(lb);
                snprintf(msg, msglen, "logit_bias must be [[token id or text, bias or false], "
                         "...] or an object of token ids or texts");
                return key;
            }
            json_object_set_new(oai, "logit_bias", lb);
        } else {
            *code = KVPD_OAI_E_UNSUPPORTED_PARAMETER;
            snprintf(msg, msglen, "%.64s is not a field kvpd serves on /completion", key);
            return key;
        }
    }
    return NULL;
}

void kvpd_oai_llama_completion(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    json_t *req = kvpd_oai_parse(c);
    if (!req)
        return;
    llama_state *ls = calloc(1, sizeof *ls);
    json_t *oai = json_object();
    int *ids = NULL;
    if (!ls || !oai) {
        free(ls);
        kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
        goto out;
    }
    o->codec = &llama_codec;
    o->codec_state = ls;
    char msg[256];
    enum kvpd_oai_code code;
    const char *field = llama_translate(c, req, oai, ls, &code, msg, sizeof msg);
    if (field) {
        kvpd_oai_fail(c, code, field, msg);
        goto out;
    }
    kvp_hub_info hi;
    kvp_hub_info_get(c->w->hub, &hi);
    /* ignore_eos: every token that would end the reply banned, over a bias the request
     * gave it (llama.cpp's end-of-generation tokens) */
    for (int i = 0; ls->ignore_eos && i < 3; i++) {
        if (hi.raw_stop[i] < 0)
            continue;
        json_t *lb = json_object_get(oai, "logit_bias");
        if (!lb)
            json_object_set_new(oai, "logit_bias", lb = json_object());
        char id[24];
        snprintf(id, sizeof id, "%d", hi.raw_stop[i]);
        json_object_set_new(lb, id, json_real(-100));
    }
    json_t *cp = json_object_get(req, "cache_prompt");
    if (cp && !json_is_null(cp) && !json_is_boolean(cp)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "cache_prompt", "cache_prompt must be a boolean");
        goto out;
    }
    kvp_turn_opts t;
    if (kvpd_oai_model_ok(c, req) < 0 || kvpd_oai_options(c, oai, &t) < 0)
        goto out;
    t.fresh = json_is_false(cp);   /* cache_prompt false: prefilled whole, nothing reused */
    json_t *seed = json_object_get(req, "seed");
    if (json_is_integer(seed) && (json_integer_value(seed) == -1 ||
                                  json_integer_value(seed) == 0xFFFFFFFF))
        t.has_seed = 0;   /* a random seed, fixed_seed or not */
    /* Token ids come with the logprobs: the chunks of a stream always list theirs (as
     * llama.cpp's), the whole answer with return_tokens, and n_probs adds the logprobs. */
    if (o->req.stream || ls->return_tokens || ls->n_probs) {
        t.logprobs = o->req.turn.logprobs = 1;
        t.top_logprobs = o->req.turn.top_logprobs = ls->n_probs;
    }
    /* The prompt: a string (or an array holding one), an array of token ids, or
     * llama.cpp's object form {"prompt_string"} (its multimodal_data is refused: kvpd's
     * models read text only). */
    json_t *p = json_object_get(req, "prompt");
    if (json_is_array(p) && json_array_size(p) == 1 && json_is_string(json_array_get(p, 0)))
        p = json_array_get(p, 0);
    if (json_is_object(p)) {
        const char *k;
        json_t *v;
        json_object_foreach(p, k, v) {
            if (!strcmp(k, "prompt_string"))
                continue;
            char param[80];
            snprintf(param, sizeof param, "prompt.%.64s", k);
            snprintf(msg, sizeof msg, "%s is not supported by kvpd%s", param,
                     !strcmp(k, "multimodal_data") ? ": its models read text only" : "");
            kvpd_oai_fail(c, KVPD_OAI_E_UNSUPPORTED_PARAMETER, param, msg);
            goto out;
        }
        p = json_object_get(p, "prompt_string");
    }
    int n = 0;
    if (json_is_array(p)) {
        n = (int)json_array_size(p);
        if (n == 0 || n > (1 << 20) || !(ids = malloc((size_t)n * sizeof *ids))) {
            kvpd_oai_fail(c, n ? KVPD_OAI_E_SERVER : KVPD_OAI_E_INVALID_REQUEST, "prompt",
                          n ? "out of memory" : "prompt must not be empty");
            goto out;
        }
        for (int i = 0; i < n; i++) {
            json_t *e = json_array_get(p, (size_t)i);
            char param[32];
            snprintf(param, sizeof param, "prompt[%d]", i);
            if (!json_is_integer(e)) {
                snprintf(msg, sizeof msg, "%s: a prompt array holds token ids only (one prompt "
                         "of text, or of tokens; mixed and several prompts are not supported "
                         "by kvpd)", param);
                kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, param, msg);
                goto out;
            }
            if (json_integer_value(e) < 0 || json_integer_value(e) >= hi.vocab_size) {
                snprintf(msg, sizeof msg, "%s: token id %lld is out of range: 0 to %d", param,
                         (long long)json_integer_value(e), hi.vocab_size - 1);
                kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, param, msg);
                goto out;
            }
            ids[i] = (int)json_integer_value(e);
        }
    } else if (!json_is_string(p) || json_string_length(p) == 0) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "prompt",
                      "prompt must be a non-empty string or an array of token ids");
        goto out;
    }
    /* what the answer echoes: the text, or the tokens' pieces */
    if (ids) {
        size_t len = 0, pl;
        for (int i = 0; i < n; i++) {
            kvp_hub_token_piece(c->w->hub, i ? ids[i - 1] : -1, ids[i], &pl);
            len += pl;
        }
        if ((ls->prompt = malloc(len + 1))) {
            len = 0;
            for (int i = 0; i < n; i++) {
                const char *pc = kvp_hub_token_piece(c->w->hub, i ? ids[i - 1] : -1, ids[i], &pl);
                memcpy(ls->prompt + len, pc, pl);
                len += pl;
            }
            ls->prompt[len] = '\0';
            ls->prompt_len = len;
        }
        if (ls->prompt && !kvp_utf8_valid(ls->prompt, len)) {   /* a partial character */
            free(ls->prompt);
            ls->prompt = NULL;
        }
    } else {
        ls->prompt = kvp_text_dup(json_string_value(p), json_string_length(p));
        ls->prompt_len = json_string_length(p);
    }
    if (!ls->prompt) {
        ls->prompt = strdup("");
        ls->prompt_len = 0;
    }
    for (int i = 0; i < t.n_stop; i++)
        if ((ls->stops[i] = kvp_text_dup(t.stop[i], t.stop_len[i])))
            ls->n_stops = i + 1;
    json_t *np = json_object_get(oai, "max_tokens");
    ls->settings = kvpd_oai_llama_params(c->w->cfg, &t, np ? (int)json_integer_value(np) : -1,
                                         o->req.stream);
    run(c, json_string_value(p), json_string_length(p), ids, n, &t);
out:
    free(ids);
    json_decref(oai);
    json_decref(req);
}
