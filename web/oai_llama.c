/* llama.cpp's server's own endpoints beside /completion (docs/openai.md, "llama.cpp's
 * endpoints"): POST /tokenize and /detokenize over the tokenizer raw prompts are run
 * with (kvp_hub_tokenize: the vocabulary's, no chat template, a special token's text
 * stays text), GET /props (the defaults a completion runs with, the context, the chat
 * template) and GET /slots (the caller's tenant's conversations held in memory, as
 * slots). Every field is checked: one kvpd does not take is refused naming it. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/utf8.h"
#include "web/openai_impl.h"

/* The first field of req not among names[0..n), or NULL. */
static const char *unknown_field(json_t *req, const char *const *names, size_t n)
{
    const char *key;
    json_t *v;
    json_object_foreach(req, key, v) {
        size_t i = 0;
        while (i < n && strcmp(key, names[i]))
            i++;
        if (i == n)
            return key;
    }
    return NULL;
}

static int refuse_unknown(kvpd_conn *c, json_t *req, const char *const *names, size_t n)
{
    const char *field = unknown_field(req, names, n);
    if (!field)
        return 0;
    char msg[160];
    snprintf(msg, sizeof msg, "%.64s is not a field kvpd serves here", field);
    kvpd_oai_fail(c, KVPD_OAI_E_UNSUPPORTED_PARAMETER, field, msg);
    return -1;
}

/* A boolean field (absent or null: dflt); -1 after answering 400. */
static int boolean(kvpd_conn *c, json_t *req, const char *name, int dflt)
{
    json_t *v = json_object_get(req, name);
    if (!v || json_is_null(v))
        return dflt;
    if (!json_is_boolean(v)) {
        char msg[96];
        snprintf(msg, sizeof msg, "%s must be a boolean", name);
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, name, msg);
        return -1;
    }
    return json_is_true(v);
}

/* Bytes as a JSON string: valid UTF-8, what cannot be as U+FFFD. */
static json_t *text_json(const char *p, size_t len)
{
    char *buf = malloc(3 * len + 8);
    if (!buf)
        return NULL;
    kvp_utf8 u = {0};
    size_t k = kvp_utf8_feed(&u, p, len, buf);
    k += kvp_utf8_flush(&u, buf + k);
    json_t *j = json_stringn(buf, k);
    free(buf);
    return j;
}

/* A token's piece as llama.cpp gives it: the string when it is valid UTF-8, else the
 * array of its bytes. */
static json_t *piece_json(const char *p, size_t len)
{
    if (kvp_utf8_valid(p, len))
        return json_stringn(p, len);
    json_t *a = json_array();
    for (size_t i = 0; a && i < len; i++)
        json_array_append_new(a, json_integer((unsigned char)p[i]));
    return a;
}

/* The text /tokenize takes at most. It is tokenized on libuv's thread pool, never on the
 * loop; the bound keeps one request's hold on a pool thread short (a prompt that long
 * is tokenized by its turn's worker instead). */
#define TOKENIZE_MAX (128 * 1024)

/* /tokenize's work, off the loop (kvpd_oai_offload_run): the text tokenized and the
 * answer built and serialized; the vocabulary and the raw template are fixed while the
 * hub runs. */
typedef struct tok_job {
    const kvp_hub *hub;
    json_t *req;                  /* holds text */
    const char *text;
    size_t len;
    int add, pieces;
    char *answer;                 /* the answer's body, NULL when it could not be made */
} tok_job;

static void tok_run(void *arg)
{
    tok_job *j = arg;
    int *ids = NULL;
    int n = kvp_hub_tokenize(j->hub, j->text, j->len, j->add, &ids);
    json_t *tokens = n >= 0 ? json_array() : NULL;
    for (int i = 0; tokens && i < n; i++) {
        if (!j->pieces) {
            json_array_append_new(tokens, json_integer(ids[i]));
            continue;
        }
        size_t len;
        const char *p = kvp_hub_token_piece(j->hub, -1, ids[i], &len);
        json_array_append_new(tokens, json_pack("{s:i, s:o}", "id", ids[i], "piece",
                                                piece_json(p ? p : "", len)));
    }
    free(ids);
    json_t *a = tokens ? json_pack("{s:o}", "tokens", tokens) : NULL;
    j->answer = a ? json_dumps(a, JSON_COMPACT) : NULL;
    json_decref(a);
}

static void tok_drop(void *arg)
{
    tok_job *j = arg;
    free(j->answer);
    json_decref(j->req);
    free(j);
}

static void tok_done(kvpd_conn *c, void *arg)
{
    tok_job *j = arg;
    if (!j->answer)
        kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "the text could not be tokenized");
    else
        kvpd_oai_answer_text(c, 200, j->answer);
    tok_drop(j);
}

void kvpd_oai_tokenize(kvpd_conn *c)
{
    json_t *req = kvpd_oai_parse(c);
    if (!req)
        return;
    static const char *const names[] = {"content", "add_special", "with_pieces",
                                        "parse_special"};
    int add, pieces, special;
    if (refuse_unknown(c, req, names, sizeof names / sizeof names[0]) < 0 ||
        (add = boolean(c, req, "add_special", 0)) < 0 ||
        (pieces = boolean(c, req, "with_pieces", 0)) < 0 ||
        (special = boolean(c, req, "parse_special", 0)) < 0)
        goto out;
    if (special) {
        kvpd_oai_fail(c, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "parse_special",
                      "parse_special is not supported by kvpd: a special token's text is "
                      "tokenized as text (only false)");
        goto out;
    }
    json_t *content = json_object_get(req, "content");
    if (!json_is_string(content)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "content", "content must be a string");
        goto out;
    }
    if (json_string_length(content) > TOKENIZE_MAX) {
        char msg[96];
        snprintf(msg, sizeof msg, "content is limited to %d bytes on /tokenize", TOKENIZE_MAX);
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "content", msg);
        goto out;
    }
    tok_job *j = calloc(1, sizeof *j);
    if (!j) {
        kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
        goto out;
    }
    *j = (tok_job){.hub = c->w->hub, .req = req, .text = json_string_value(content),
                   .len = json_string_length(content), .add = add, .pieces = pieces};
    if (kvpd_oai_offload_run(c, tok_run, tok_done, tok_drop, j) < 0) {
        free(j);
        kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
        goto out;
    }
    return;   /* the job holds req */
out:
    json_decref(req);
}

void kvpd_oai_detokenize(kvpd_conn *c)
{
    json_t *req = kvpd_oai_parse(c);
    if (!req)
        return;
    static const char *const names[] = {"tokens"};
    kvp_hub_info hi;
    kvp_hub_info_get(c->w->hub, &hi);
    char *text = NULL;
    if (refuse_unknown(c, req, names, 1) < 0)
        goto out;
    json_t *tokens = json_object_get(req, "tokens");
    if (!json_is_array(tokens)) {
        kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, "tokens",
                      "tokens must be an array of token ids");
        goto out;
    }
    size_t n = json_array_size(tokens), len = 0, cap = 0;
    int prev = -1;
    for (size_t i = 0; i < n; i++) {
        json_t *e = json_array_get(tokens, i);
        char param[32], msg[128];
        snprintf(param, sizeof param, "tokens[%zu]", i);
        if (!json_is_integer(e) || json_integer_value(e) < 0 ||
            json_integer_value(e) >= hi.vocab_size) {
            snprintf(msg, sizeof msg, "%s must be a token id from 0 to %d", param,
                     hi.vocab_size - 1);
            kvpd_oai_fail(c, KVPD_OAI_E_INVALID_REQUEST, param, msg);
            goto out;
        }
        int id = (int)json_integer_value(e);
        size_t pl;
        const char *p = kvp_hub_token_piece(c->w->hub, prev, id, &pl);
        if (len + pl + 1 > cap) {
            size_t ncap = cap ? cap * 2 : 256;
            while (ncap < len + pl + 1)
                ncap *= 2;
            char *t = realloc(text, ncap);
            if (!t) {
                kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
                goto out;
            }
            text = t;
            cap = ncap;
        }
        memcpy(text + len, p, pl);
        len += pl;
        prev = id;
    }
    kvpd_oai_answer(c, 200, json_pack("{s:o}", "content", text_json(text ? text : "", len)));
out:
    free(text);
    json_decref(req);
}

/* A token's text for /props ("" for none). */
static json_t *token_text(kvpd_conn *c, int id)
{
    size_t len = 0;
    const char *p = id >= 0 ? kvp_hub_token_piece(c->w->hub, -1, id, &len) : NULL;
    return text_json(p ? p : "", p ? len : 0);
}

void kvpd_oai_props(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    kvp_hub_info hi;
    kvp_hub_info_get(c->w->hub, &hi);
    int cap = c->w->cfg->max_tokens;
    /* the seed a request without one samples with: the server's under fixed_seed */
    kvp_turn_opts dflt = {.has_seed = c->w->cfg->fixed_seed, .seed = c->w->cfg->seed};
    json_t *dgs = json_pack("{s:i, s:i, s:b, s:o}", "id", 0, "n_ctx", hi.context,
                            "is_processing", 0, "params",
                            kvpd_oai_llama_params(c->w->cfg, &dflt, cap > 0 ? cap : -1, 0));
    json_t *j = json_pack("{s:o, s:i, s:s, s:s, s:s, s:o, s:o, s:s, s:{s:b, s:b}}",
                          "default_generation_settings", dgs, "total_slots",
                          c->w->cfg->max_sessions, "model_path", c->w->cfg->model,
                          "model_alias", o->model, "chat_template", hi.chat_template,
                          "bos_token", token_text(c, hi.bos), "eos_token", token_text(c, hi.eos),
                          "build_info", "kvpd", "modalities", "vision", 0, "audio", 0);
    kvpd_oai_answer(c, 200, j);
}

typedef struct slots_ctx {
    kvpd_conn *c;
    json_t *list;
    int context;
} slots_ctx;

static void slot_of(void *ctx, const kvp_hub_session_info *si)
{
    slots_ctx *sc = ctx;
    if (si->parked || strcmp(si->tenant, sc->c->tenant))
        return;
    /* never the session's id: it is the key to the conversation */
    json_array_append_new(sc->list, json_pack(
        "{s:i, s:i, s:i, s:b, s:i, s:i}", "id", (int)json_array_size(sc->list), "id_task", -1,
        "n_ctx", sc->context, "is_processing", si->busy, "n_turns", si->turns,
        "cache_rows", si->rows));
}

void kvpd_oai_slots(kvpd_conn *c)
{
    kvp_hub_info hi;
    kvp_hub_info_get(c->w->hub, &hi);
    slots_ctx sc = {c, json_array(), hi.context};
    if (sc.list)
        kvp_hub_list(c->w->hub, 0, 1 << 30, slot_of, &sc);
    kvpd_oai_answer(c, 200, sc.list);
}
