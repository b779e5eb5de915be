/* web/oai_reply.c: the OpenAI API's answer objects (errors, usage and kvpd's figures,
 * finish reasons, chat completions and stream chunks, the model list), Server-Sent Event
 * frames and fresh ids. The logprob shapes are tests/web/test_oai_logprobs.c's. */
#include <criterion/criterion.h>
#include <ctype.h>
#include <string.h>

#include "web/oai_reply.h"

static const kvp_turn_stats stats = {.prompt_tokens = 5, .prefilled_tokens = 4,
                                     .generated_tokens = 7, .transcript_tokens = 30,
                                     .context_tokens = 23, .cached_tokens = 19,
                                     .cache_rows = 28, .evicted_rows = 3, .stop = "eos"};

static json_int_t int_at(const json_t *j, const char *a, const char *b)
{
    const json_t *v = json_object_get(j, a);
    if (b)
        v = json_object_get(v, b);
    cr_assert(json_is_integer(v), "%s.%s", a, b ? b : "");
    return json_integer_value(v);
}

Test(oai_reply, an_error_body)
{
    json_t *e = kvpd_oai_error_json(KVPD_OAI_E_INVALID_REQUEST, "temperature", "too hot xx", 8);
    json_t *o = json_object_get(e, "error");
    cr_assert_str_eq(json_string_value(json_object_get(o, "message")), "too hot ");
    cr_assert_str_eq(json_string_value(json_object_get(o, "type")),
                     kvpd_oai_code_type(KVPD_OAI_E_INVALID_REQUEST));
    cr_assert_str_eq(json_string_value(json_object_get(o, "param")), "temperature");
    json_decref(e);
    e = kvpd_oai_error_json(KVPD_OAI_E_INTERNAL, NULL, "x", 1);
    o = json_object_get(e, "error");
    cr_assert(json_is_null(json_object_get(o, "param")), "param null, not absent");
    json_decref(e);
}

Test(oai_reply, usage_and_kvpd_figures)
{
    json_t *u = kvpd_oai_usage(&stats);
    cr_assert_eq(int_at(u, "prompt_tokens", NULL), 23, "the whole prompt the reply follows");
    cr_assert_eq(int_at(u, "completion_tokens", NULL), 7);
    cr_assert_eq(int_at(u, "total_tokens", NULL), 30);
    cr_assert_eq(int_at(u, "prompt_tokens_details", "cached_tokens"), 19);
    json_decref(u);
    json_t *k = kvpd_oai_kvpd_stats("s1", 1, &stats);
    cr_assert_str_eq(json_string_value(json_object_get(k, "session")), "s1");
    cr_assert_eq(int_at(k, "prefilled_tokens", NULL), 4);
    cr_assert_eq(int_at(k, "transcript_tokens", NULL), 30);
    cr_assert_eq(int_at(k, "cache_rows", NULL), 28);
    cr_assert_eq(int_at(k, "evicted_rows", NULL), 3);
    cr_assert(json_is_true(json_object_get(k, "durable")));
    json_decref(k);
    k = kvpd_oai_kvpd_stats("s1", 0, &stats);
    cr_assert(json_is_false(json_object_get(k, "durable")));
    json_decref(k);
    k = kvpd_oai_kvpd_stats("s1", -1, &stats);
    cr_assert(json_is_null(json_object_get(k, "durable")), "no store: null");
    json_decref(k);
}

Test(oai_reply, finish_reasons)
{
    kvp_turn_stats st = stats;
    cr_assert_str_eq(kvpd_oai_finish_reason(&st, 0), "stop");
    st.stop = "length";
    cr_assert_str_eq(kvpd_oai_finish_reason(&st, 0), "length");
    cr_assert_str_eq(kvpd_oai_finish_reason(&st, 2), "tool_calls");
    st.stop = "stop";
    cr_assert_str_eq(kvpd_oai_finish_reason(&st, 0), "stop");
    st.stop = "cancel";
    cr_assert_str_eq(kvpd_oai_finish_reason(&st, 0), "stop");
}

Test(oai_reply, a_whole_completion)
{
    kvpd_oai_meta m = {"chatcmpl-1", 1700000000, "stories"};
    json_t *c = kvpd_oai_completion(&m, json_pack("{s:s, s:s}", "role", "assistant", "content",
                                                  "Hi"), "stop", &stats, "s9", -1);
    cr_assert_str_eq(json_string_value(json_object_get(c, "id")), "chatcmpl-1");
    cr_assert_str_eq(json_string_value(json_object_get(c, "object")), "chat.completion");
    cr_assert_eq(int_at(c, "created", NULL), 1700000000);
    cr_assert_str_eq(json_string_value(json_object_get(c, "model")), "stories");
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    cr_assert_eq(json_array_size(json_object_get(c, "choices")), 1);
    cr_assert_eq(int_at(ch, "index", NULL), 0);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(ch, "message"),
                                                       "content")), "Hi");
    cr_assert(json_is_null(json_object_get(ch, "logprobs")));
    cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    cr_assert_eq(int_at(c, "usage", "completion_tokens"), 7);
    cr_assert_str_eq(json_string_value(json_object_get(c, "session")), "s9");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(c, "kvpd"), "session")),
                     "s9");
    json_decref(c);
}

Test(oai_reply, stream_chunks)
{
    kvpd_oai_meta m = {"chatcmpl-2", 5, "mm"};
    json_t *c = kvpd_oai_chunk(&m, kvpd_oai_chunk_role());
    cr_assert_str_eq(json_string_value(json_object_get(c, "object")), "chat.completion.chunk");
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    json_t *d = json_object_get(ch, "delta");
    cr_assert_str_eq(json_string_value(json_object_get(d, "role")), "assistant");
    cr_assert_str_eq(json_string_value(json_object_get(d, "content")), "");
    cr_assert(json_is_null(json_object_get(ch, "finish_reason")));
    json_decref(c);

    json_t *choices = kvpd_oai_chunk_at(
        kvpd_oai_chunk_delta(json_pack("{s:s}", "content", "lo")), 3);
    ch = json_array_get(choices, 0);
    cr_assert_eq(int_at(ch, "index", NULL), 3, "a later choice's index");
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(ch, "delta"),
                                                       "content")), "lo");
    cr_assert(json_is_null(json_object_get(ch, "finish_reason")));
    json_decref(choices);

    kvp_turn_stats cut = stats;
    cut.stop = "length";
    choices = kvpd_oai_chunk_at(kvpd_oai_chunk_finish("length", &cut), 0);
    ch = json_array_get(choices, 0);
    cr_assert_eq(int_at(ch, "index", NULL), 0);
    cr_assert_eq(json_object_size(json_object_get(ch, "delta")), 0, "an empty delta");
    cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "length");
    cr_assert_null(json_object_get(ch, "kvpd_shaped_by"), "an unshaped reply says nothing");
    json_decref(choices);

    kvp_turn_stats shaped = stats;
    shaped.shaped = 1;
    choices = kvpd_oai_chunk_finish("stop", &shaped);
    ch = json_array_get(choices, 0);
    cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    cr_assert_str_eq(json_string_value(json_object_get(ch, "kvpd_shaped_by")), "max_tokens",
                     "the finish chunk of a shaped reply names the limit");
    json_decref(choices);
}

Test(oai_reply, a_shaped_reply_names_its_limit)
{
    kvp_turn_stats st = stats;
    st.shaped = 1;
    kvpd_oai_meta m = {"chatcmpl-3", 1, "mm"};
    json_t *c = kvpd_oai_completion(&m, json_pack("{s:s}", "role", "assistant"), "stop", &st,
                                    NULL, -1);
    json_t *ch = json_array_get(json_object_get(c, "choices"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(ch, "kvpd_shaped_by")), "max_tokens");
    json_decref(c);
    json_t *r = kvpd_oai_with_shaped(json_object(), &st, "max_output_tokens");
    cr_assert_str_eq(json_string_value(json_object_get(r, "kvpd_shaped_by")), "max_output_tokens");
    json_decref(r);
    /* a reply cut at its limit is not whole: it finishes "length" and claims no shaping */
    st.stop = "length";
    r = kvpd_oai_with_shaped(json_object(), &st, "max_tokens");
    cr_assert_eq(json_object_size(r), 0);
    json_decref(r);
    st.stop = "eos";
    st.shaped = 0;
    c = kvpd_oai_completion(&m, json_pack("{s:s}", "role", "assistant"), "stop", &st, NULL, -1);
    ch = json_array_get(json_object_get(c, "choices"), 0);
    cr_assert_null(json_object_get(ch, "kvpd_shaped_by"), "an unshaped reply says nothing");
    json_decref(c);
}

static const char *model_id(const json_t *list, size_t i)
{
    return json_string_value(json_object_get(json_array_get(json_object_get(list, "data"), i),
                                             "id"));
}

Test(oai_reply, the_model_list)
{
    json_t *l = kvpd_oai_models("", "stories260K", 9);
    cr_assert_str_eq(json_string_value(json_object_get(l, "object")), "list");
    cr_assert_eq(json_array_size(json_object_get(l, "data")), 1);
    cr_assert_str_eq(model_id(l, 0), "stories260K", "no aliases: the model's own name");
    json_t *e = json_array_get(json_object_get(l, "data"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(e, "object")), "model");
    cr_assert_eq(int_at(e, "created", NULL), 9);
    cr_assert_str_eq(json_string_value(json_object_get(e, "owned_by")), "kvpd");
    json_decref(l);
    l = kvpd_oai_models("gpt-4o,,local,", "stories260K", 9);
    cr_assert_eq(json_array_size(json_object_get(l, "data")), 2, "empty ids are no entries");
    cr_assert_str_eq(model_id(l, 0), "gpt-4o");
    cr_assert_str_eq(model_id(l, 1), "local");
    json_decref(l);
    l = kvpd_oai_models(",", "m", 9);
    cr_assert_eq(json_array_size(json_object_get(l, "data")), 1);
    cr_assert_str_eq(model_id(l, 0), "m");
    json_decref(l);
}

Test(oai_reply, server_sent_event_frames)
{
    size_t len = 0;
    char *f = kvpd_oai_sse_frame(NULL, json_pack("{s:i}", "a", 1), &len);
    cr_assert_str_eq(f, "data: {\"a\":1}\n\n");
    cr_assert_eq(len, strlen(f));
    free(f);
    f = kvpd_oai_sse_frame("response.created", json_pack("{s:s}", "b", "x"), &len);
    cr_assert_str_eq(f, "event: response.created\ndata: {\"b\":\"x\"}\n\n");
    cr_assert_eq(len, strlen(f));
    free(f);
    cr_assert_null(kvpd_oai_sse_frame("x", NULL, &len), "nothing to send: no frame");
    cr_assert_str_eq(KVPD_OAI_SSE_DONE, "data: [DONE]\n\n");
}

Test(oai_reply, fresh_ids)
{
    char a[64], b[64];
    cr_assert_eq(kvpd_oai_new_id(a, sizeof a, "chatcmpl-"), 0);
    cr_assert_eq(kvpd_oai_new_id(b, sizeof b, "chatcmpl-"), 0);
    cr_assert_eq(strlen(a), strlen("chatcmpl-") + 24);
    cr_assert_eq(strncmp(a, "chatcmpl-", 9), 0);
    for (size_t i = 9; i < strlen(a); i++)
        cr_assert(isxdigit((unsigned char)a[i]) && !isupper((unsigned char)a[i]), "%s", a);
    cr_assert_str_neq(a, b, "two ids are not the same");
    char small[12];
    cr_assert_eq(kvpd_oai_new_id(small, sizeof small, "resp_"), 0);
    cr_assert_eq(strlen(small), sizeof small - 1, "cut to the buffer, terminated");
}
