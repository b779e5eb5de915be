/* One OpenAI API request body from untrusted bytes (docs/openai.md): parsed as a chat
 * completion with and without tool calling and strict model names, and its options as
 * the other endpoints parse them, and as a Responses request (web/oai_items.h: its
 * chat-shaped twin, input items, conversation). What the parse promises is checked: an answer is a
 * user-ended conversation within the limits, a refusal an error with its status and a
 * message, and nothing is held after a refusal. */
#include <stdlib.h>
#include <string.h>

#include "tests/fuzz/fuzz.h"
#include "web/oai_items.h"
#include "web/oai_parse.h"

static void check_refusal(const kvpd_oai_req *r, const kvpd_oai_err *e)
{
    if (e->status < 400 || e->status > 599 || e->status != kvpd_oai_code_status(e->code) ||
        !e->message[0] || r->msgs || r->system || r->prefill)
        abort();
}

static void chat(const uint8_t *data, size_t size, const kvpd_oai_limits *l)
{
    kvpd_oai_req r;
    kvpd_oai_err e;
    memset(&r, 0, sizeof r);
    if (kvpd_oai_parse_chat((const char *)data, size, l, &r, &e) == 0) {
        if (r.n_msgs < 1 || !r.msgs[r.n_msgs - 1].user || r.system_len > KVP_HUB_SYSTEM_MAX ||
            (r.has_session && r.session[0] && !kvp_session_id_ok(r.session)) ||
            r.turn.n_stop > KVP_HUB_MAX_STOPS || r.own.n_stops != r.turn.n_stop ||
            (l->max_tokens && r.turn.max_tokens > l->max_tokens))
            abort();
        for (int i = 0; i < r.n_msgs; i++)   /* every text is whole and readable */
            if (r.msgs[i].len && (!r.msgs[i].text || r.msgs[i].text[r.msgs[i].len] != '\0'))
                abort();
        /* an assistant prefill: non-empty, the turn's, and nothing that cannot continue it */
        if (r.prefill && (!r.prefill_len || r.prefill[r.prefill_len] != '\0' || !r.turn.prefill ||
                          r.turn.reply_prefix != r.prefill || r.grammar || r.tools.grammar))
            abort();
        if (!r.prefill && r.turn.prefill)
            abort();
    } else {
        check_refusal(&r, &e);
    }
    kvpd_oai_release(&r);
}

static void options(const uint8_t *data, size_t size, const kvpd_oai_limits *l)
{
    kvpd_oai_err e;
    json_t *req = kvpd_oai_parse_json((const char *)data, size, &e);
    if (!req) {
        if (e.status != 400)
            abort();
        return;
    }
    kvpd_oai_req r;
    memset(&r, 0, sizeof r);
    if (kvpd_oai_parse_model(req, l, &e) == 0 && kvpd_oai_parse_options(req, l, &r, &e) < 0)
        check_refusal(&r, &e);
    kvpd_oai_release(&r);
    json_decref(req);
}

/* The Responses API's mapping: a refusal names a field with a 400, an answer is the shape
 * it promises, and the conversation becomes messages that chat's parse takes or refuses. */
static void responses(const uint8_t *data, size_t size, const kvpd_oai_limits *l)
{
    kvpd_oai_err e;
    json_t *req = kvpd_oai_parse_json((const char *)data, size, &e);
    if (!req)
        return;
    memset(&e, 0, sizeof e);
    json_t *twin = kvpd_items_request(req, &e);
    if (!twin && (e.status != 400 || !e.message[0]))
        abort();
    json_t *items = twin ? kvpd_items_input(json_object_get(req, "input"), &e) : NULL;
    if (twin && !items && e.status != 400)
        abort();
    json_t *chat = items ? kvpd_items_chat(items, 0, "sys", 3, &e) : NULL;
    if (items && !chat && e.status != 400)
        abort();
    if (chat) {
        if (!json_is_array(chat) || json_array_size(chat) < 1)
            abort();
        kvpd_oai_req r;
        memset(&r, 0, sizeof r);
        if (kvpd_oai_parse_options(twin, l, &r, &e) == 0 &&
            kvpd_oai_parse_messages(chat, "input", 0, &r, &e) == 0) {
            if (r.n_msgs < 1 || !r.msgs[r.n_msgs - 1].user || !r.system || r.system_len != 3)
                abort();
        }
        kvpd_oai_release(&r);
        kvpd_items_error_names(&e, json_object_get(req, "tools"));
    }
    json_t *out = kvpd_items_output(req, "msg_x", "completed");
    json_t *text = kvpd_items_output_text(out);
    if (!json_is_array(out) || json_array_size(out) < 1 || !json_is_string(text))
        abort();
    json_decref(text);
    json_decref(out);
    json_decref(chat);
    json_decref(items);
    json_decref(twin);
    json_decref(req);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    const kvpd_oai_limits plain = {.max_tokens = 256, .model_alias = "", .model = "m"};
    const kvpd_oai_limits tools = {.max_tokens = 64, .strict_model_name = 1,
                                   .model_alias = "gpt-4o,,mini", .model = "m",
                                   .tool_format = KVP_TOOLS_HERMES, .reasoning = 1};
    chat(data, size, &plain);
    chat(data, size, &tools);
    options(data, size, &tools);
    responses(data, size, &tools);
    return 0;
}
