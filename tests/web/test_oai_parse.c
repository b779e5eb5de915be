/* web/oai_parse.c: chat completion bodies into the hub's turn, and every refusal with its
 * status, code and field. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/grammar.h"
#include "web/oai_parse.h"

static const kvpd_oai_limits lim = {.max_tokens = 100, .model_alias = "", .model = "qwen",
                                    .tool_format = KVP_TOOLS_HERMES};

static int parse(const char *body, kvpd_oai_req *r, kvpd_oai_err *e, const kvpd_oai_limits *l)
{
    memset(r, 0, sizeof *r);
    memset(e, 0, sizeof *e);
    return kvpd_oai_parse_chat(body, strlen(body), l ? l : &lim, r, e);
}

/* The body is refused with status, code and param ("" none); nothing is held. */
static void refused(const char *body, int status, enum kvpd_oai_code code, const char *param)
{
    kvpd_oai_req r;
    kvpd_oai_err e;
    cr_assert_eq(parse(body, &r, &e, NULL), -1, "accepted: %s", body);
    cr_assert_eq(e.status, status, "%s: status %d", body, e.status);
    cr_assert_eq(e.code, code, "%s: code %d", body, e.code);
    cr_assert_str_eq(e.param, param, "%s: param %s", body, e.param);
    cr_assert(e.message[0], "%s: no message", body);
    cr_assert_null(r.msgs);
    cr_assert_null(r.system);
    kvpd_oai_release(&r);
}

Test(oai_parse, a_conversation)
{
    kvpd_oai_req r;
    kvpd_oai_err e;
    cr_assert_eq(parse("{\"model\":\"anything\",\"messages\":["
                       "{\"role\":\"system\",\"content\":\"Be brief.\"},"
                       "{\"role\":\"user\",\"content\":[{\"type\":\"text\",\"text\":\"Hi \"},"
                       "{\"type\":\"text\",\"text\":\"there\"}]},"
                       "{\"role\":\"assistant\",\"content\":\"Hello.\"},"
                       "{\"role\":\"developer\",\"content\":\"In French.\"},"
                       "{\"role\":\"user\",\"content\":\"Why?\"}],"
                       "\"session\":\"00112233445566778899aabbccddeeff\"}", &r, &e, NULL), 0,
                 "%s", e.message);
    cr_assert_eq(r.system_len, 9);
    cr_assert_str_eq(r.system, "Be brief.");
    cr_assert_eq(r.n_msgs, 3);
    cr_assert_eq(r.msgs[0].user, 1);
    cr_assert_str_eq(r.msgs[0].text, "Hi there");
    cr_assert_eq(r.msgs[1].user, 0);
    /* a later system message is folded into the user message after it */
    cr_assert_str_eq(r.msgs[2].text, "In French.\n\nWhy?");
    cr_assert_eq(r.msgs[2].len, strlen("In French.\n\nWhy?"));
    cr_assert(r.has_session);
    cr_assert_str_eq(r.session, "00112233445566778899aabbccddeeff");
    cr_assert_eq(r.stream, 0);
    kvpd_oai_release(&r);
    cr_assert_null(r.msgs);
}

Test(oai_parse, options)
{
    kvpd_oai_req r;
    kvpd_oai_err e;
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\\u0000b\"}],"
                       "\"stream\":true,\"stream_options\":{\"include_usage\":true},"
                       "\"max_tokens\":1000,\"temperature\":0.5,\"top_p\":0.9,\"seed\":7,"
                       "\"stop\":[\"x\",\"yz\"],\"top_k\":40,\"logit_bias\":{\"13\":-100}}",
                       &r, &e, NULL), 0, "%s", e.message);
    cr_assert_eq(r.msgs[0].len, 3);   /* the NUL is part of the text */
    cr_assert(r.stream && r.include_usage);
    cr_assert_eq(r.turn.max_tokens, 100);   /* capped by the server's max_tokens */
    cr_assert(r.turn.has_temperature && r.turn.temperature == 0.5f);
    cr_assert(r.turn.has_seed && r.turn.seed == 7);
    cr_assert_eq(r.turn.n_stop, 2);
    cr_assert_eq(r.turn.stop_len[1], 2);
    cr_assert_eq(memcmp(r.turn.stop[1], "yz", 2), 0);
    cr_assert_eq(r.turn.sampling.top_k, 40);
    cr_assert_eq(r.turn.sampling.n_bias, 1);
    cr_assert_eq(r.turn.sampling.bias[0].token, 13);
    kvpd_oai_release(&r);
    /* the newer name wins over max_tokens; a single stop string */
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                       "\"max_tokens\":50,\"max_completion_tokens\":5,\"stop\":\"END\"}",
                       &r, &e, NULL), 0, "%s", e.message);
    cr_assert_eq(r.turn.max_tokens, 5);
    cr_assert_eq(r.turn.n_stop, 1);
    kvpd_oai_release(&r);
}

Test(oai_parse, malformed_and_truncated)
{
    refused("", 400, KVPD_OAI_E_INVALID_JSON, "");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"tru", 400, KVPD_OAI_E_INVALID_JSON, "");
    refused("[{\"role\":\"user\"}]", 400, KVPD_OAI_E_INVALID_JSON, "");
    refused("{\"a\":1,\"a\":2}", 400, KVPD_OAI_E_INVALID_JSON, "");   /* a duplicate key */
    refused("{}", 400, KVPD_OAI_E_INVALID_REQUEST, "messages");
    kvpd_oai_err e;
    cr_assert_null(kvpd_oai_parse_json(NULL, 0, &e));
    cr_assert_eq(e.code, KVPD_OAI_E_INVALID_JSON);
}

Test(oai_parse, wrong_types)
{
    refused("{\"messages\":{\"role\":\"user\"}}", 400, KVPD_OAI_E_INVALID_REQUEST, "messages");
    refused("{\"messages\":[]}", 400, KVPD_OAI_E_INVALID_REQUEST, "messages");
    refused("{\"messages\":[{\"role\":\"robot\",\"content\":\"a\"}]}", 400,
            KVPD_OAI_E_INVALID_REQUEST, "messages[0].role");
    refused("{\"messages\":[{\"role\":\"us\\u0000er\",\"content\":\"a\"}]}", 400,
            KVPD_OAI_E_INVALID_REQUEST, "messages[0].role");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":5}]}", 400,
            KVPD_OAI_E_INVALID_REQUEST, "messages[0].content");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":[{\"type\":\"image_url\"}]}]}", 400,
            KVPD_OAI_E_INVALID_REQUEST, "messages[0].content");
    /* an assistant message last is a prefill: it needs a user message before it, text,
     * and no tool calls; a forced call or response_format cannot continue it */
    refused("{\"messages\":[{\"role\":\"assistant\",\"content\":\"b\"}]}", 400,
            KVPD_OAI_E_INVALID_REQUEST, "messages");
    refused("{\"messages\":[{\"role\":\"system\",\"content\":\"s\"},"
            "{\"role\":\"assistant\",\"content\":\"b\"}]}", 400, KVPD_OAI_E_INVALID_REQUEST,
            "messages");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
            "{\"role\":\"assistant\",\"content\":\"\"}]}", 400, KVPD_OAI_E_INVALID_REQUEST,
            "messages[1].content");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
            "{\"role\":\"assistant\",\"content\":null}]}", 400, KVPD_OAI_E_INVALID_REQUEST,
            "messages[1].content");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
            "{\"role\":\"assistant\",\"content\":\"b\",\"tool_calls\":[{\"id\":\"c\","
            "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]}]}",
            400, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "messages[1].tool_calls");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
            "{\"role\":\"assistant\",\"content\":\"b\"}],\"tools\":[{\"type\":\"function\","
            "\"function\":{\"name\":\"f\"}}],\"tool_choice\":\"required\"}", 400,
            KVPD_OAI_E_UNSUPPORTED_PARAMETER, "tool_choice");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
            "{\"role\":\"assistant\",\"content\":\"{\"}],\"response_format\":"
            "{\"type\":\"json_object\"}}", 400, KVPD_OAI_E_UNSUPPORTED_PARAMETER,
            "response_format");
    const char *user = "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]";
    static const struct { const char *field, *param; } bad[] = {
        {"\"model\":5", "model"}, {"\"temperature\":\"hot\"", "temperature"},
        {"\"temperature\":2.5", "temperature"}, {"\"top_p\":-1", "top_p"},
        {"\"max_tokens\":0", "max_tokens"}, {"\"max_tokens\":1.5", "max_tokens"},
        {"\"top_k\":2.5", "top_k"}, {"\"repetition_penalty\":0", "repetition_penalty"},
        {"\"logit_bias\":[1]", "logit_bias"}, {"\"logit_bias\":{\"x\":1}", "logit_bias"},
        {"\"logit_bias\":{\"1\":101}", "logit_bias"}, {"\"seed\":1.5", "seed"},
        {"\"stop\":[\"\"]", "stop"}, {"\"stop\":[1]", "stop"},
        {"\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]", "stop"}, {"\"stream\":1", "stream"},
        {"\"session\":7", "session"}, {"\"session\":\"ABC\"", "session"},
        {"\"session\":\"00112233445566778899AABBCCDDEEFF\"", "session"},
        {"\"session\":\"00112233445566778899aabbccddeeff\\u0000x\"", "session"},
        {"\"session\":\"\\u000000112233445566778899aabbccddeeff\"", "session"},
        {"\"logprobs\":\"yes\"", "logprobs"}, {"\"top_logprobs\":3", "top_logprobs"},
        {"\"logprobs\":true,\"top_logprobs\":21", "top_logprobs"},
        {"\"n\":0", "n"}, {"\"n\":9", "n"}, {"\"n\":1.5", "n"}, {"\"n\":\"2\"", "n"},
        {"\"n\":-1", "n"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{%s,%s}", user, bad[i].field);
        refused(body, 400, KVPD_OAI_E_INVALID_REQUEST, bad[i].param);
    }
}

Test(oai_parse, fields_kvpd_cannot_honour)
{
    const char *user = "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]";
    static const struct { const char *field, *param; } bad[] = {
        {"\"n\":2,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
         "\"parameters\":{\"type\":\"object\"}}}]", "n"},
        {"\"functions\":[{}]", "functions"},
        {"\"logprobs\":true,\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"f\","
         "\"parameters\":{\"type\":\"object\"}}}]", "logprobs"},
        {"\"audio\":{}", "audio"}, {"\"modalities\":[\"audio\"]", "modalities"},
        {"\"response_format\":{\"type\":\"xml\"}", "response_format.type"},
        /* llama.cpp's server's fields, at values that would change the reply */
        {"\"grammar\":\"root ::= \\\"a\\\"\"", "grammar"},
        {"\"return_progress\":true", "return_progress"},
        {"\"timings_per_token\":true", "timings_per_token"},
        {"\"ignore_eos\":true", "ignore_eos"},
        {"\"post_sampling_probs\":true", "post_sampling_probs"},
        {"\"id_slot\":0", "id_slot"}, {"\"n_probs\":5", "n_probs"},
        {"\"add_generation_prompt\":false", "add_generation_prompt"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{%s,%s}", user, bad[i].field);
        refused(body, 400, KVPD_OAI_E_UNSUPPORTED_PARAMETER, bad[i].param);
    }
}

/* llama.cpp's server's chat fields: at their neutral values accepted; json_schema is the
 * reply's schema; continue_final_message and add_generation_prompt as kvpd continues (or
 * not) the last message. */
Test(oai_parse, llama_cpp_fields)
{
    kvpd_oai_req r;
    kvpd_oai_err e;
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                       "\"grammar\":\"\",\"return_progress\":false,\"timings_per_token\":false,"
                       "\"ignore_eos\":false,\"id_slot\":-1,\"n_probs\":0,"
                       "\"add_generation_prompt\":true,\"continue_final_message\":false}",
                       &r, &e, NULL), 0, "%s", e.message);
    cr_assert_null(r.grammar);
    cr_assert_not(r.turn.prefill);
    kvpd_oai_release(&r);
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
                       "\"json_schema\":{\"const\":\"42\"}}", &r, &e, NULL), 0, "%s", e.message);
    cr_assert_not_null(r.grammar, "json_schema shapes the reply");
    cr_assert(r.turn.grammar == r.grammar);
    kvpd_oai_release(&r);
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"json_schema\":"
            "{\"type\":\"hiccup\"}}", 400, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "json_schema");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"json_schema\":{},"
            "\"response_format\":{\"type\":\"json_object\"}}", 400,
            KVPD_OAI_E_INVALID_REQUEST, "json_schema");
    /* an assistant message last is continued: continue_final_message true, or
     * add_generation_prompt false, says the same */
    const char *prefill = "\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                          "{\"role\":\"assistant\",\"content\":\"Wh\"}]";
    char body[512];
    snprintf(body, sizeof body, "{%s,\"continue_final_message\":true,"
             "\"add_generation_prompt\":false}", prefill);
    cr_assert_eq(parse(body, &r, &e, NULL), 0, "%s", e.message);
    cr_assert(r.turn.prefill);
    kvpd_oai_release(&r);
    snprintf(body, sizeof body, "{%s,\"continue_final_message\":true,"
             "\"add_generation_prompt\":true}", prefill);
    refused(body, 400, KVPD_OAI_E_INVALID_REQUEST, "continue_final_message");
    snprintf(body, sizeof body, "{%s,\"continue_final_message\":1}", prefill);
    refused(body, 400, KVPD_OAI_E_INVALID_REQUEST, "continue_final_message");
    refused("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],"
            "\"continue_final_message\":true}", 400, KVPD_OAI_E_INVALID_REQUEST,
            "continue_final_message");
}

/* fixed_seed: a request without a seed takes the server's; its own seed still wins */
Test(oai_parse, fixed_seed)
{
    kvpd_oai_limits l = lim;
    l.fixed_seed = 1;
    l.seed = 42;
    kvpd_oai_req r;
    kvpd_oai_err e;
    const char *user = "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]";
    char body[256];
    snprintf(body, sizeof body, "%s}", user);
    cr_assert_eq(parse(body, &r, &e, &l), 0, "%s", e.message);
    cr_assert(r.turn.has_seed && r.turn.seed == 42);
    kvpd_oai_release(&r);
    snprintf(body, sizeof body, "%s,\"seed\":7}", user);
    cr_assert_eq(parse(body, &r, &e, &l), 0, "%s", e.message);
    cr_assert(r.turn.has_seed && r.turn.seed == 7);
    kvpd_oai_release(&r);
    cr_assert_eq(parse(body, &r, &e, NULL), 0, "%s", e.message);   /* off: only its own */
    kvpd_oai_release(&r);
    snprintf(body, sizeof body, "%s}", user);
    cr_assert_eq(parse(body, &r, &e, NULL), 0, "%s", e.message);
    cr_assert_not(r.turn.has_seed);
    kvpd_oai_release(&r);
}

/* A schema whose grammar is over a size bound: a 400 naming the schema and the bound. */
Test(oai_parse, a_schema_over_the_grammar_size_is_refused_naming_the_bound)
{
    size_t cap = 64 * 1024, n = 0;
    char *body = malloc(cap);
    cr_assert_not_null(body);
    n += (size_t)snprintf(body + n, cap - n, "{\"messages\":[{\"role\":\"user\",\"content\":"
                          "\"a\"}],\"response_format\":{\"type\":\"json_schema\","
                          "\"json_schema\":{\"name\":\"big\",\"schema\":{\"type\":\"object\","
                          "\"properties\":{");
    for (int i = 0; i < 8; i++)
        n += (size_t)snprintf(body + n, cap - n, "%s\"p%d\":{\"type\":\"string\","
                              "\"maxLength\":4096}", i ? "," : "", i);
    snprintf(body + n, cap - n, "}}}}}");
    kvpd_oai_req r;
    kvpd_oai_err e;
    cr_assert_eq(parse(body, &r, &e, NULL), -1);
    cr_expect_eq(e.status, 400);
    cr_expect_str_eq(e.param, "response_format.json_schema.schema");
    char want[64];
    snprintf(want, sizeof want, "over %d states", KVP_GRAMMAR_MAX_STATES);
    cr_expect(strstr(e.message, want), "%s", e.message);
    kvpd_oai_release(&r);
    free(body);
}

Test(oai_parse, oversized)
{
    /* a system text over KVP_HUB_SYSTEM_MAX, refused after the messages were read */
    size_t n = KVP_HUB_SYSTEM_MAX + 1;
    char *body = malloc(n + 128);
    cr_assert_not_null(body);
    int k = sprintf(body, "{\"messages\":[{\"role\":\"system\",\"content\":\"");
    memset(body + k, 's', n);
    sprintf(body + k + n, "\"},{\"role\":\"user\",\"content\":\"a\"}]}");
    refused(body, 400, KVPD_OAI_E_INVALID_REQUEST, "messages[0].content");
    /* a stop string over KVP_HUB_STOP_MAX */
    k = sprintf(body, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"stop\":\"");
    memset(body + k, 'x', KVP_HUB_STOP_MAX + 1);
    sprintf(body + k + KVP_HUB_STOP_MAX + 1, "\"}");
    refused(body, 400, KVPD_OAI_E_INVALID_REQUEST, "stop");
    free(body);
    /* more logit_bias entries than the sampler takes */
    char lb[16 * (KVP_SAMPLER_MAX_BIAS + 2) + 128];
    k = sprintf(lb, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"logit_bias\":{");
    for (int i = 0; i <= KVP_SAMPLER_MAX_BIAS; i++)
        k += sprintf(lb + k, "%s\"%d\":1", i ? "," : "", i);
    sprintf(lb + k, "}}");
    refused(lb, 400, KVPD_OAI_E_INVALID_REQUEST, "logit_bias");
}

Test(oai_parse, strict_model_name)
{
    kvpd_oai_limits l = lim;
    l.strict_model_name = 1;
    l.model_alias = "gpt-4o,mini";
    kvpd_oai_req r;
    kvpd_oai_err e;
    const char *ok[] = {"qwen", "mini", "gpt-4o"};
    for (int i = 0; i < 3; i++) {
        char body[256];
        snprintf(body, sizeof body, "{\"model\":\"%s\",\"messages\":[{\"role\":\"user\","
                 "\"content\":\"a\"}]}", ok[i]);
        cr_assert_eq(parse(body, &r, &e, &l), 0, "%s: %s", ok[i], e.message);
        kvpd_oai_release(&r);
    }
    cr_assert_eq(parse("{\"model\":\"gpt\",\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}",
                       &r, &e, &l), -1);
    cr_assert_eq(e.status, 404);
    cr_assert_eq(e.code, KVPD_OAI_E_MODEL_NOT_FOUND);
    cr_assert_str_eq(e.param, "model");
    kvpd_oai_release(&r);
}

Test(oai_parse, session_ids)
{
    cr_assert(kvp_session_id_ok("00112233445566778899aabbccddeeff"));
    cr_assert(!kvp_session_id_ok("00112233445566778899aabbccddeef"));
    cr_assert(!kvp_session_id_ok("00112233445566778899aabbccddeefff"));
    cr_assert(!kvp_session_id_ok("00112233445566778899aabbccddeefg"));
    cr_assert(!kvp_session_id_ok(""));
    cr_assert(!kvp_session_id_ok("00112233445566778899AABBCCDDEEFF"));
    /* an empty session names none: a new conversation */
    kvpd_oai_req r;
    kvpd_oai_err e;
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"session\":\"\"}",
                       &r, &e, NULL), 0);
    cr_assert(r.has_session);
    cr_assert_str_eq(r.session, "");
    kvpd_oai_release(&r);
}

Test(oai_parse, n_choices)
{
    kvpd_oai_req r;
    kvpd_oai_err e;
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]}", &r, &e, NULL), 0);
    cr_assert_eq(r.n_choices, 1, "n absent: one choice");
    kvpd_oai_release(&r);
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":null}", &r, &e,
                       NULL), 0);
    cr_assert_eq(r.n_choices, 1, "n null: one choice");
    kvpd_oai_release(&r);
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":8,"
                       "\"seed\":5,\"temperature\":0}", &r, &e, NULL), 0, "%s", e.message);
    cr_assert_eq(r.n_choices, 8);
    kvpd_oai_release(&r);
    /* a JSON schema's grammar is shared by every choice */
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"a\"}],\"n\":3,"
                       "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":"
                       "{\"name\":\"x\",\"schema\":{\"type\":\"integer\"}}}}", &r, &e, NULL), 0,
                 "%s", e.message);
    cr_assert_eq(r.n_choices, 3);
    cr_assert_not_null(r.turn.grammar);
    kvpd_oai_release(&r);
}

/* An assistant message last (after the user's) is continued: it leaves the messages and
 * becomes the turn's prefill; text parts count as its content. */
Test(oai_parse, an_assistant_message_last_is_a_prefill)
{
    kvpd_oai_req r;
    kvpd_oai_err e;
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                       "{\"role\":\"assistant\",\"content\":[{\"type\":\"text\",\"text\":\"Hel\"},"
                       "{\"type\":\"text\",\"text\":\"lo, I\"}]}],\"n\":2}", &r, &e, NULL), 0,
                 "%s", e.message);
    cr_assert_eq(r.n_msgs, 1);
    cr_assert_eq(r.msgs[0].user, 1);
    cr_assert_eq(r.prefill_len, 8);
    cr_assert_eq(memcmp(r.prefill, "Hello, I", 8), 0);
    cr_assert(r.turn.prefill);
    cr_assert_eq(r.turn.reply_prefix, r.prefill);
    cr_assert_eq(r.turn.reply_prefix_len, 8);
    kvpd_oai_release_messages(&r);
    cr_assert_null(r.prefill);
    cr_assert_null(r.turn.reply_prefix);
    cr_assert_eq(r.turn.prefill, 0);
    kvpd_oai_release(&r);
    /* after tool results too */
    cr_assert_eq(parse("{\"messages\":[{\"role\":\"user\",\"content\":\"t\"},"
                       "{\"role\":\"assistant\",\"content\":null,\"tool_calls\":[{\"id\":\"c1\","
                       "\"type\":\"function\",\"function\":{\"name\":\"f\",\"arguments\":\"{}\"}}]},"
                       "{\"role\":\"tool\",\"tool_call_id\":\"c1\",\"content\":\"9\"},"
                       "{\"role\":\"assistant\",\"content\":\"It is\"}]}", &r, &e, NULL), 0,
                 "%s", e.message);
    cr_assert_eq(r.msgs[r.n_msgs - 1].user, KVP_MESSAGE_TOOL);
    cr_assert_eq(r.prefill_len, 5);
    kvpd_oai_release(&r);
}

/* A top-level field the endpoint does not have is a 400 unknown_parameter naming it, never
 * ignored; the benign fields real clients send are accepted, each endpoint its own. */
Test(oai_parse, unknown_fields_are_refused_naming_them)
{
    const char *user = "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]";
    static const char *unknown[] = {"\"frobnicate\":1", "\"reasoning_effort\":\"high\"",
                                    "\"web_search_options\":{}", "\"Temperature\":1",
                                    "\"input\":\"x\""};
    for (size_t i = 0; i < sizeof unknown / sizeof unknown[0]; i++) {
        char body[512], want[64];
        snprintf(body, sizeof body, "{%s,%s}", user, unknown[i]);
        const char *k = unknown[i] + 1;
        snprintf(want, sizeof want, "%.*s", (int)(strchr(k, '"') - k), k);
        refused(body, 400, KVPD_OAI_E_UNKNOWN_PARAMETER, want);
        kvpd_oai_req r;
        kvpd_oai_err e;
        parse(body, &r, &e, NULL);
        cr_assert(strstr(e.message, want) && strstr(e.message, "unknown parameter"), "%s", e.message);
        kvpd_oai_release(&r);
    }
    /* the benign ones, and every field chat completions reads, pass the check */
    static const char *fine[] = {"\"user\":\"u1\"", "\"metadata\":{\"a\":\"b\"}",
                                 "\"service_tier\":\"auto\"", "\"safety_identifier\":\"x\"",
                                 "\"prompt_cache_key\":\"k\"", "\"store\":false",
                                 "\"stream_options\":{\"include_usage\":true}",
                                 "\"parallel_tool_calls\":true", "\"top_k\":3", "\"seed\":1"};
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        char body[512];
        snprintf(body, sizeof body, "{%s,%s}", user, fine[i]);
        kvpd_oai_req r;
        kvpd_oai_err e;
        cr_assert_eq(parse(body, &r, &e, NULL), 0, "%s: %s", body, e.message);
        kvpd_oai_release(&r);
    }
    /* store: true asks for what kvpd has not */
    char body[256];
    snprintf(body, sizeof body, "{%s,\"store\":true}", user);
    refused(body, 400, KVPD_OAI_E_UNSUPPORTED_PARAMETER, "store");
    snprintf(body, sizeof body, "{%s,\"store\":1}", user);
    refused(body, 400, KVPD_OAI_E_INVALID_REQUEST, "store");
}

/* Each endpoint has its own fields: a Responses field is unknown to chat completions and
 * to completions, a chat one to the Responses API, and completions' benign list is only
 * `user`. */
Test(oai_parse, each_endpoint_checks_its_own_fields)
{
    static const struct { const char *body; enum kvpd_oai_api api; const char *bad; } cases[] = {
        {"{\"input\":\"x\",\"instructions\":\"y\",\"store\":false,\"include\":[],"
         "\"prompt_cache_key\":\"k\",\"reasoning\":null,\"parallel_tool_calls\":false,"
         "\"tool_choice\":\"auto\",\"tools\":[],\"stream\":true,\"text\":{}}",
         KVPD_OAI_API_RESPONSES, NULL},
        {"{\"input\":\"x\",\"messages\":[]}", KVPD_OAI_API_RESPONSES, "messages"},
        {"{\"input\":\"x\",\"response_format\":{}}", KVPD_OAI_API_RESPONSES, "response_format"},
        {"{\"prompt\":\"x\",\"user\":\"u\",\"echo\":false,\"top_k\":2}", KVPD_OAI_API_COMPLETIONS, NULL},
        {"{\"prompt\":\"x\",\"service_tier\":\"auto\"}", KVPD_OAI_API_COMPLETIONS, "service_tier"},
        {"{\"prompt\":\"x\",\"instructions\":\"y\"}", KVPD_OAI_API_COMPLETIONS, "instructions"},
        {"{\"messages\":[],\"instructions\":\"y\"}", KVPD_OAI_API_CHAT, "instructions"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = json_loads(cases[i].body, 0, NULL);
        cr_assert(j, "%s", cases[i].body);
        kvpd_oai_err e;
        memset(&e, 0, sizeof e);
        int rc = kvpd_oai_check_fields(j, cases[i].api, &e);
        if (cases[i].bad) {
            cr_assert_eq(rc, -1, "%s: accepted", cases[i].body);
            cr_assert_eq(e.code, KVPD_OAI_E_UNKNOWN_PARAMETER);
            cr_assert_eq(e.status, 400);
            cr_assert_str_eq(e.param, cases[i].bad, "%s", cases[i].body);
        } else {
            cr_assert_eq(rc, 0, "%s: %s", cases[i].body, e.message);
        }
        json_decref(j);
    }
}

/* Unknown keys inside stream_options (every endpoint) and the Responses text object are a
 * 400 unknown_parameter naming the dotted path; the keys OpenAI defines there pass;
 * text.verbosity other than the default is refused by name. */
Test(oai_parse, nested_unknown_fields_are_refused_by_path)
{
    static const struct {
        const char *body;
        enum kvpd_oai_api api;
        const char *bad;
        enum kvpd_oai_code code;
    } cases[] = {
        {"{\"messages\":[],\"stream_options\":{\"include_usage\":true,\"include_obfuscation\":false}}",
         KVPD_OAI_API_CHAT, NULL, 0},
        {"{\"messages\":[],\"stream_options\":{\"include_usage\":true,\"chunk_size\":4}}",
         KVPD_OAI_API_CHAT, "stream_options.chunk_size", KVPD_OAI_E_UNKNOWN_PARAMETER},
        {"{\"prompt\":\"x\",\"stream_options\":{\"Include_usage\":true}}",
         KVPD_OAI_API_COMPLETIONS, "stream_options.Include_usage", KVPD_OAI_E_UNKNOWN_PARAMETER},
        {"{\"input\":\"x\",\"stream_options\":{\"include_obfuscation\":false}}",
         KVPD_OAI_API_RESPONSES, NULL, 0},
        {"{\"input\":\"x\",\"stream_options\":{\"include_usage\":true}}",
         KVPD_OAI_API_RESPONSES, "stream_options.include_usage", KVPD_OAI_E_UNKNOWN_PARAMETER},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"text\"},\"verbosity\":\"medium\"}}",
         KVPD_OAI_API_RESPONSES, NULL, 0},
        {"{\"input\":\"x\",\"text\":{\"verbosity\":null}}", KVPD_OAI_API_RESPONSES, NULL, 0},
        {"{\"input\":\"x\",\"text\":{\"verbosity\":\"low\"}}",
         KVPD_OAI_API_RESPONSES, "text.verbosity", KVPD_OAI_E_UNSUPPORTED_PARAMETER},
        {"{\"input\":\"x\",\"text\":{\"verbosity\":3}}",
         KVPD_OAI_API_RESPONSES, "text.verbosity", KVPD_OAI_E_UNSUPPORTED_PARAMETER},
        {"{\"input\":\"x\",\"text\":{\"format\":{\"type\":\"text\"},\"style\":\"terse\"}}",
         KVPD_OAI_API_RESPONSES, "text.style", KVPD_OAI_E_UNKNOWN_PARAMETER},
        /* a long unknown key is cut in the path, the request still refused */
        {"{\"input\":\"x\",\"text\":{\"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\":1}}",
         KVPD_OAI_API_RESPONSES, "text.aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
         KVPD_OAI_E_UNKNOWN_PARAMETER},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        json_t *j = json_loads(cases[i].body, 0, NULL);
        cr_assert(j, "%s", cases[i].body);
        kvpd_oai_err e;
        memset(&e, 0, sizeof e);
        int rc = kvpd_oai_check_fields(j, cases[i].api, &e);
        if (cases[i].bad) {
            cr_assert_eq(rc, -1, "%s: accepted", cases[i].body);
            cr_assert_eq(e.code, cases[i].code, "%s", cases[i].body);
            cr_assert_eq(e.status, 400);
            cr_assert_str_eq(e.param, cases[i].bad, "%s", cases[i].body);
            cr_assert(strstr(e.message, cases[i].bad), "%s", e.message);
        } else {
            cr_assert_eq(rc, 0, "%s: %s", cases[i].body, e.message);
        }
        json_decref(j);
    }
}

/* Inside response_format, a tool and tool_choice, a key OpenAI's API does not define is a
 * 400 unknown_parameter naming its whole path, the message as the top level's; a wrong
 * type is a 400 naming the field; the requests the SDK helpers send (openai's
 * zodResponseFormat and zodFunction, the AI SDK's generateObject, LangChain's
 * withStructuredOutput with a forced named call) are served. */
Test(oai_parse, keys_inside_response_format_and_tools_are_checked)
{
    const char *user = "\"messages\":[{\"role\":\"user\",\"content\":\"a\"}]";
    const char *schema = "{\"type\":\"object\",\"properties\":{\"name\":{\"type\":\"string\"}},"
                         "\"required\":[\"name\"],\"additionalProperties\":false}";
    char body[1024];
    const char *fine[] = {
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"person\","
        "\"strict\":true,\"schema\":%s}}",
        "\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"schema\":%s,"
        "\"strict\":true,\"name\":\"response\",\"description\":\"a person\"}}",
        "\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"person\",\"parameters\":%s,"
        "\"strict\":true,\"description\":\"d\"}}],\"tool_choice\":{\"type\":\"function\","
        "\"function\":{\"name\":\"person\"}}",
    };
    for (size_t i = 0; i < sizeof fine / sizeof fine[0]; i++) {
        char field[768];
        snprintf(field, sizeof field, fine[i], schema);
        snprintf(body, sizeof body, "{%s,%s}", user, field);
        kvpd_oai_req r;
        kvpd_oai_err e;
        cr_assert_eq(parse(body, &r, &e, NULL), 0, "%s: %s", body, e.message);
        cr_assert_not_null(r.turn.grammar, "%s: the reply is constrained", body);
        kvpd_oai_release(&r);
    }
    static const struct { const char *field, *param; enum kvpd_oai_code code; } bad[] = {
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
         "\"schema\":{},\"foo\":1}}", "response_format.json_schema.foo",
         KVPD_OAI_E_UNKNOWN_PARAMETER},
        {"\"response_format\":{\"type\":\"json_object\",\"strict\":true}",
         "response_format.strict", KVPD_OAI_E_UNKNOWN_PARAMETER},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}},{\"type\":\"function\","
         "\"function\":{\"name\":\"b\"}},{\"type\":\"function\",\"function\":{\"name\":\"c\","
         "\"bar\":1}}]", "tools[2].function.bar", KVPD_OAI_E_UNKNOWN_PARAMETER},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"},\"cache\":true}]",
         "tools[0].cache", KVPD_OAI_E_UNKNOWN_PARAMETER},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":"
         "{\"type\":\"function\",\"function\":{\"name\":\"a\"},\"mode\":\"x\"}",
         "tool_choice.mode", KVPD_OAI_E_UNKNOWN_PARAMETER},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\"}}],\"tool_choice\":"
         "{\"type\":\"function\",\"function\":{\"name\":\"a\",\"x\":1}}",
         "tool_choice.function.x", KVPD_OAI_E_UNKNOWN_PARAMETER},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":\"n\","
         "\"strict\":\"yes\",\"schema\":{}}}", "response_format.json_schema.strict",
         KVPD_OAI_E_UNSUPPORTED_PARAMETER},
        {"\"response_format\":{\"type\":\"json_schema\",\"json_schema\":{\"name\":5,"
         "\"schema\":{}}}", "response_format.json_schema.name", KVPD_OAI_E_UNSUPPORTED_PARAMETER},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"description\":[]}}]",
         "tools[0].function.description", KVPD_OAI_E_INVALID_REQUEST},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":\"a\",\"strict\":\"yes\"}}]",
         "tools[0].function.strict", KVPD_OAI_E_INVALID_REQUEST},
        {"\"tools\":[{\"type\":\"function\",\"function\":{\"name\":5}}]",
         "tools[0].function.name", KVPD_OAI_E_INVALID_REQUEST},
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        snprintf(body, sizeof body, "{%s,%s}", user, bad[i].field);
        refused(body, 400, bad[i].code, bad[i].param);
        kvpd_oai_req r;
        kvpd_oai_err e;
        parse(body, &r, &e, NULL);
        cr_assert(strstr(e.message, bad[i].param), "%s: %s", body, e.message);
        if (bad[i].code == KVPD_OAI_E_UNKNOWN_PARAMETER)
            cr_assert(strstr(e.message, "unknown parameter '"), "%s", e.message);
        kvpd_oai_release(&r);
    }
}
