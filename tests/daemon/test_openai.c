/* Integration: the OpenAI-compatible API (web/openai.c) over raw HTTP: every error status,
 * malformed and oversized bodies, streaming (chunk order, usage, [DONE]), continuation of
 * a conversation, stop strings, a client that leaves mid-stream (its turn is cancelled),
 * a reader that takes the stream one byte at a time, 32 concurrent streams, the sampler's
 * fields (penalties, logit_bias, top_k, min_p) honoured and their bad values refused. */
#include <arpa/inet.h>
#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/daemon/harness.h"

TestSuite(openai, .timeout = 120);

static int dial(const kvpd_proc *p)
{
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(fd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_port = htons((uint16_t)p->port)};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    cr_assert_eq(connect(fd, (struct sockaddr *)&a, sizeof a), 0);
    return fd;
}

static void send_all(int fd, const char *buf, size_t len)
{
    while (len) {
        ssize_t n = send(fd, buf, len, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return;   /* the server may close early (413): the answer is still readable */
        buf += n;
        len -= (size_t)n;
    }
}

/* Sends a request (Connection: close) on fd. */
static void send_request(int fd, const char *method, const char *path, const char *headers,
                         const char *body, size_t len)
{
    char head[1024];
    int n = snprintf(head, sizeof head, "%s %s HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     "Content-Type: application/json\r\nContent-Length: %zu\r\n%s"
                     "Connection: close\r\n\r\n", method, path, len, headers ? headers : "");
    send_all(fd, head, (size_t)n);
    send_all(fd, body, len);
}

typedef struct answer {
    int status;
    char *raw, *body;
} answer;

static answer request(const kvpd_proc *p, const char *method, const char *path,
                      const char *headers, const char *body)
{
    answer a = {0};
    const char *b;
    a.status = h_request(p->port, method, path, headers, body, &a.raw, &b);
    cr_assert(a.raw, "%s %s: cannot connect", method, path);
    a.body = (char *)b;
    return a;
}

static const char *header(const answer *a, const char *name)
{
    return h_header(a->raw, name);
}

/* The error's param and code, checked against the status and OpenAI's shape. */
static void expect_error(const kvpd_proc *p, const char *headers, const char *body, int status,
                         const char *param)
{
    answer a = request(p, "POST", "/v1/chat/completions", headers, body);
    cr_assert_eq(a.status, status, "%s -> %s", body, a.raw);
    json_t *j = json_loads(a.body, 0, NULL);
    cr_assert(j, "not JSON: %s", a.body);
    json_t *e = json_object_get(j, "error");
    cr_assert(json_is_string(json_object_get(e, "message")), "%s", a.body);
    cr_assert(json_is_string(json_object_get(e, "type")), "%s", a.body);
    cr_assert(json_object_get(e, "param") && json_object_get(e, "code"), "%s", a.body);
    if (param)
        cr_assert_str_eq(json_string_value(json_object_get(e, "param")), param, "%s", a.body);
    json_decref(j);
    free(a.raw);
}

#define USER(text) "{\"messages\":[{\"role\":\"user\",\"content\":\"" text "\"}]"

Test(openai, every_bad_request_gets_its_status_and_the_daemon_keeps_serving)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-body-bytes 65536"), 0);
    expect_error(&d, NULL, "{\"messages\":[", 400, NULL);
    expect_error(&d, NULL, "[1,2]", 400, NULL);
    expect_error(&d, NULL, "", 400, NULL);
    expect_error(&d, NULL, "{}", 400, "messages");
    expect_error(&d, NULL, "{\"messages\":[]}", 400, "messages");
    expect_error(&d, NULL, "{\"messages\":\"hi\"}", 400, "messages");
    expect_error(&d, NULL, "{\"messages\":[{\"role\":\"wizard\",\"content\":\"x\"}]}", 400,
                 "messages[0].role");
    expect_error(&d, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":7}]}", 400,
                 "messages[0].content");
    expect_error(&d, NULL, "{\"messages\":[{\"role\":\"assistant\",\"content\":\"b\"}]}", 400,
                 "messages");
    expect_error(&d, NULL, "{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},"
                 "{\"role\":\"assistant\",\"content\":\"\"}]}", 400, "messages[1].content");
    expect_error(&d, NULL, USER("x") ",\"n\":0}", 400, "n");
    expect_error(&d, NULL, USER("x") ",\"n\":9}", 400, "n");
    expect_error(&d, NULL, USER("x") ",\"n\":2.5}", 400, "n");
    expect_error(&d, NULL, USER("x") ",\"n\":\"3\"}", 400, "n");
    /* tools need a model whose template has a tool-call format: stories260K has none */
    expect_error(&d, NULL, USER("x") ",\"tools\":[{\"type\":\"function\"}]}", 400, "tools");
    /* logprobs are served now (tests/daemon/test_logprobs.c): what is refused is a
     * malformed or out-of-range request for them */
    expect_error(&d, NULL, USER("x") ",\"logprobs\":true,\"top_logprobs\":21}", 400,
                 "top_logprobs");
    expect_error(&d, NULL, USER("x") ",\"top_logprobs\":2}", 400, "top_logprobs");
    expect_error(&d, NULL, USER("x") ",\"logprobs\":\"yes\"}", 400, "logprobs");
    /* json_object and json_schema are kept now (tests/openai/structured.mjs): an unknown
     * type and a schema kvpd cannot compile are what is refused */
    expect_error(&d, NULL, USER("x") ",\"response_format\":{\"type\":\"xml\"}}", 400,
                 "response_format.type");
    expect_error(&d, NULL, USER("x") ",\"response_format\":{\"type\":\"json_schema\","
                 "\"json_schema\":{\"name\":\"s\",\"schema\":{\"type\":\"string\","
                 "\"format\":\"uri\"}}}}", 400, "response_format.json_schema.schema");
    /* a key the format has not is refused by its whole path */
    expect_error(&d, NULL, USER("x") ",\"response_format\":{\"type\":\"json_schema\","
                 "\"json_schema\":{\"name\":\"s\",\"schema\":{},\"foo\":1}}}", 400,
                 "response_format.json_schema.foo");
    expect_error(&d, NULL, USER("x") ",\"response_format\":{\"type\":\"json_object\","
                 "\"strict\":true}}", 400, "response_format.strict");
    expect_error(&d, NULL, USER("x") ",\"temperature\":\"hot\"}", 400, "temperature");
    expect_error(&d, NULL, USER("x") ",\"max_tokens\":-3}", 400, "max_tokens");
    expect_error(&d, NULL, USER("x") ",\"stop\":[\"a\",\"b\",\"c\",\"d\",\"e\"]}", 400, "stop");
    expect_error(&d, NULL, USER("x") ",\"stream\":\"yes\"}", 400, "stream");
    expect_error(&d, NULL, USER("x") ",\"session\":\"not-an-id\"}", 400, "session");
    expect_error(&d, NULL, USER("x") ",\"model\":7}", 400, "model");
    expect_error(&d, NULL, USER("x") ",\"frequency_penalty\":2.5}", 400, "frequency_penalty");
    expect_error(&d, NULL, USER("x") ",\"presence_penalty\":-3}", 400, "presence_penalty");
    expect_error(&d, NULL, USER("x") ",\"repetition_penalty\":0}", 400, "repetition_penalty");
    expect_error(&d, NULL, USER("x") ",\"min_p\":1.5}", 400, "min_p");
    expect_error(&d, NULL, USER("x") ",\"top_k\":2.5}", 400, "top_k");
    expect_error(&d, NULL, USER("x") ",\"logit_bias\":{\"5\":101}}", 400, "logit_bias");
    expect_error(&d, NULL, USER("x") ",\"logit_bias\":{\"five\":1}}", 400, "logit_bias");
    expect_error(&d, NULL, USER("x") ",\"logit_bias\":[1]}", 400, "logit_bias");

    /* Unknown paths and methods. */
    answer a = request(&d, "POST", "/v1/nope", NULL, "{}");
    cr_assert_eq(a.status, 404, "%s", a.raw);
    cr_assert(strstr(a.body, "\"error\""));
    free(a.raw);
    a = request(&d, "GET", "/v1/chat/completions", NULL, "");
    cr_assert_eq(a.status, 405, "%s", a.raw);
    free(a.raw);
    a = request(&d, "POST", "/healthz", NULL, "{\"messages\":[]}");
    cr_assert_eq(a.status, 405, "%s", a.raw);
    free(a.raw);

    /* 10 MB: read and dropped, answered 413, nothing else disturbed. */
    size_t big = 10u << 20;
    char *body = malloc(big);
    memset(body, 'a', big);
    int fd = dial(&d);
    send_request(fd, "POST", "/v1/chat/completions", NULL, body, big);
    char *raw = h_read_all(fd, 30000, NULL);
    close(fd);
    free(body);
    cr_assert(!strncmp(raw, "HTTP/1.1 413", 12), "%.200s", raw);
    cr_assert(strstr(raw, "max_body_bytes"), "%s", raw);
    free(raw);

    /* The model's id from /v1/models is accepted; the daemon still answers. */
    a = request(&d, "GET", "/v1/models", NULL, "");
    cr_assert_eq(a.status, 200, "%s", a.raw);
    json_t *j = json_loads(a.body, 0, NULL);
    const char *id = json_string_value(json_object_get(json_array_get(json_object_get(j, "data"), 0), "id"));
    cr_assert(id && id[0]);
    char req[512];
    snprintf(req, sizeof req, USER("Once upon a time") ",\"model\":\"%s\",\"max_tokens\":4}", id);
    json_decref(j);
    free(a.raw);
    a = request(&d, "POST", "/v1/chat/completions", NULL, req);
    cr_assert_eq(a.status, 200, "%s", a.raw);
    free(a.raw);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(openai, api_key_is_required_when_set)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key sekret-key-123"), 0);
    expect_error(&d, NULL, USER("x") "}", 401, NULL);
    expect_error(&d, "Authorization: Bearer sekret-key-12\r\n", USER("x") "}", 401, NULL);
    expect_error(&d, "Authorization: Bearer sekret-key-1234\r\n", USER("x") "}", 401, NULL);
    answer a = request(&d, "GET", "/v1/models", NULL, "");
    cr_assert_eq(a.status, 401);
    free(a.raw);
    a = request(&d, "GET", "/v1/models", "Authorization: Bearer sekret-key-123\r\n", "");
    cr_assert_eq(a.status, 200, "%s", a.raw);
    free(a.raw);
    a = request(&d, "POST", "/v1/chat/completions", "Authorization: Bearer sekret-key-123\r\n",
                USER("Once") ",\"max_tokens\":3}");
    cr_assert_eq(a.status, 200, "%s", a.raw);
    free(a.raw);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* The SSE events of a stream: role first, content, finish_reason, usage, [DONE]. Returns
 * the usage chunk (a reference) and the concatenated content. */
static json_t *parse_stream(const char *body, char *content, size_t cap, const char **finish)
{
    json_t *use = NULL;
    int events = 0, done = 0;
    content[0] = '\0';
    *finish = NULL;
    for (const char *p = strstr(body, "data: "); p; p = strstr(p + 1, "\n\ndata: ")) {
        if (p[0] == '\n')
            p += 2;
        p += 6;
        cr_assert(!done, "data after [DONE]");
        if (!strncmp(p, "[DONE]", 6)) {
            done = 1;
            continue;
        }
        json_error_t err;
        json_t *j = json_loadb(p, strcspn(p, "\n"), 0, &err);
        cr_assert(j, "bad chunk: %.100s", p);
        cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion.chunk");
        json_t *ch = json_object_get(j, "choices");
        json_t *delta = json_object_get(json_array_get(ch, 0), "delta");
        if (events++ == 0)
            cr_assert_str_eq(json_string_value(json_object_get(delta, "role")), "assistant");
        if (json_array_size(ch) == 0) {
            cr_assert(json_object_get(j, "usage"), "an empty choices chunk without usage");
            use = json_incref(json_object_get(j, "usage"));
        } else {
            cr_assert_null(use, "a choices chunk after the usage chunk");
            const char *t = json_string_value(json_object_get(delta, "content"));
            if (t)
                strncat(content, t, cap - strlen(content) - 1);
            const char *f = json_string_value(json_object_get(json_array_get(ch, 0),
                                                              "finish_reason"));
            if (f) {
                cr_assert_null(*finish, "two finish_reason chunks");
                *finish = f[0] == 's' ? "stop" : "length";
            }
        }
        json_decref(j);
    }
    cr_assert(done, "no data: [DONE]");
    return use;
}

Test(openai, streams_and_continues_a_conversation_prefilling_only_new_messages)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    answer a = request(&d, "POST", "/v1/chat/completions", NULL,
                       USER("Once upon a time") ",\"max_tokens\":12,\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true}}");
    cr_assert_eq(a.status, 200, "%s", a.raw);
    cr_assert(strstr(header(&a, "content-type:"), "text/event-stream"));
    char sid[64];
    snprintf(sid, sizeof sid, "%s", header(&a, "x-session-id:"));
    cr_assert_eq(strlen(sid), 32, "no X-Session-Id: %s", a.raw);
    char reply[2048];
    const char *finish;
    json_t *u = parse_stream(a.body, reply, sizeof reply, &finish);
    cr_assert_str_eq(finish, "length");
    cr_assert(u);
    int p1 = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
    int c1 = (int)json_integer_value(json_object_get(u, "completion_tokens"));
    cr_assert_eq(c1, 12);
    cr_assert_eq(json_integer_value(json_object_get(u, "total_tokens")), p1 + c1);
    cr_assert_eq(json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                    "cached_tokens")), 0);
    json_decref(u);
    free(a.raw);

    /* Turn 2 carries turn 1 and a new message, not streamed: the same session, the earlier
     * turn cached, only the new message prefilled. */
    json_t *req = json_pack("{s:[{s:s, s:s}, {s:s, s:s}, {s:s, s:s}], s:i}", "messages",
                            "role", "user", "content", "Once upon a time", "role", "assistant",
                            "content", reply, "role", "user", "content", "The dog", "max_tokens", 6);
    char *body = json_dumps(req, 0);
    a = request(&d, "POST", "/v1/chat/completions", NULL, body);
    cr_assert_eq(a.status, 200, "%s", a.raw);
    /* found by its transcript: not named, so no id is answered (a new session would
     * name its own) */
    cr_assert(sid[0] && !header(&a, "x-session-id:")[0], "%s", a.raw);
    json_t *j = json_loads(a.body, 0, NULL);
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "chat.completion");
    u = json_object_get(j, "usage");
    int p2 = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
    int cached = (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                         "cached_tokens"));
    int prefilled = (int)json_integer_value(json_object_get(json_object_get(j, "kvpd"),
                                                            "prefilled_tokens"));
    cr_assert_geq(cached, p1 + c1 - 1, "turn 1 was recomputed (cached %d)", cached);
    cr_assert_eq(p2, cached + prefilled);
    cr_assert_leq(prefilled, 5, "more than \"The dog\" was prefilled: %d", prefilled);
    cr_assert_str_eq(json_string_value(json_object_get(
        json_array_get(json_object_get(j, "choices"), 0), "finish_reason")), "length");
    json_decref(j);
    free(a.raw);

    /* The same request again regenerates turn 2: the session is cut back to the end of
     * this prompt (turns/rewind.c) and continues, its prompt found in the cache but for
     * the last token, whose logits are not kept. */
    a = request(&d, "POST", "/v1/chat/completions", NULL, body);
    cr_assert_eq(a.status, 200, "%s", a.raw);
    cr_assert(!header(&a, "x-session-id:")[0], "a regenerate started a new session: %s", a.raw);
    j = json_loads(a.body, 0, NULL);
    u = json_object_get(j, "usage");
    cached = (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                     "cached_tokens"));
    cr_assert_geq(cached, p2 - 1, "the regenerated prompt was recomputed (cached %d of %d)",
                  cached, p2);
    json_decref(j);
    free(a.raw);
    free(body);
    json_decref(req);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(openai, a_stop_string_ends_the_reply_before_it)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    /* Greedy stories260K: "Once upon a time" -> ", there was a little girl named Lily." */
    answer a = request(&d, "POST", "/v1/chat/completions", NULL,
                       USER("Once upon a time") ",\"max_tokens\":30,\"stop\":[\"zzz\",\"Lily\"]}");
    json_t *j = json_loads(a.body, 0, NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    cr_assert_str_eq(json_string_value(json_object_get(json_object_get(ch, "message"), "content")),
                     ", there was a little girl named ", "%s", a.body);
    cr_assert_str_eq(json_string_value(json_object_get(ch, "finish_reason")), "stop");
    int p1 = (int)json_integer_value(json_object_get(json_object_get(j, "usage"), "prompt_tokens"));
    json_decref(j);
    char sid[64];
    snprintf(sid, sizeof sid, "%s", header(&a, "x-session-id:"));
    free(a.raw);
    /* The client sends the reply back as it got it (without the stop text): the session's
     * transcript ends there too, so this continues it, prefilling only the new message. */
    a = request(&d, "POST", "/v1/chat/completions", NULL,
                "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"},"
                "{\"role\":\"assistant\",\"content\":\", there was a little girl named \"},"
                "{\"role\":\"user\",\"content\":\"Sue\"}],\"max_tokens\":4}");
    cr_assert_eq(a.status, 200, "%s", a.raw);
    cr_assert(sid[0] && !header(&a, "x-session-id:")[0], "the cut reply was not matched: %s",
              a.raw);
    j = json_loads(a.body, 0, NULL);
    json_t *u = json_object_get(j, "usage");
    int cached = (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                         "cached_tokens"));
    int prefilled = (int)json_integer_value(json_object_get(json_object_get(j, "kvpd"),
                                                            "prefilled_tokens"));
    cr_assert_geq(cached, p1 + 5, "the first turn was recomputed (cached %d)", cached);
    cr_assert_eq((int)json_integer_value(json_object_get(u, "prompt_tokens")), cached + prefilled);
    cr_assert_leq(prefilled, 6, "more than \"Sue\" and the cut token were prefilled: %d", prefilled);
    json_decref(j);
    free(a.raw);
    a = request(&d, "POST", "/v1/chat/completions", NULL,
                USER("Once upon a time") ",\"max_tokens\":30,\"stop\":\"Lily\",\"stream\":true}");
    char reply[2048];
    const char *finish;
    json_decref(parse_stream(a.body, reply, sizeof reply, &finish));
    cr_assert_str_eq(reply, ", there was a little girl named ");
    cr_assert_str_eq(finish, "stop");
    free(a.raw);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* The reply's text of a non-streaming request (the caller frees it). */
static char *reply_of(const kvpd_proc *p, const char *body)
{
    answer a = request(p, "POST", "/v1/chat/completions", NULL, body);
    cr_assert_eq(a.status, 200, "%s -> %s", body, a.raw);
    json_t *j = json_loads(a.body, 0, NULL);
    json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
    const char *text = json_string_value(json_object_get(json_object_get(ch, "message"), "content"));
    cr_assert(text, "%s", a.body);
    char *out = strdup(text);
    json_decref(j);
    free(a.raw);
    return out;
}

static int count_of(const char *s, const char *word)
{
    int n = 0;
    for (const char *p = s; (p = strstr(p, word)); p += strlen(word))
        n++;
    return n;
}

/* Greedy stories260K repeats itself ("play", "She"): frequency_penalty 2 changes the
 * reply and repeats its most repeated word less; logit_bias -100 on " Lily" (token 317 of
 * tok512) keeps it out of a reply that has it; an out-of-vocabulary token is a 400 naming
 * logit_bias; top_k 1 is greedy at any temperature. */
Test(openai, penalties_and_logit_bias_are_honoured)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    char *plain = reply_of(&d, USER("Once upon a time") ",\"max_tokens\":60}");
    cr_assert(strstr(plain, " Lily"), "%s", plain);
    cr_assert_geq(count_of(plain, " play"), 2, "%s", plain);
    char *pen = reply_of(&d, USER("Once upon a time") ",\"max_tokens\":60,\"frequency_penalty\":2}");
    cr_expect_str_neq(pen, plain);
    cr_expect_lt(count_of(pen, " play"), count_of(plain, " play"), "%s\n%s", plain, pen);
    char *pres = reply_of(&d, USER("Once upon a time") ",\"max_tokens\":60,\"presence_penalty\":2}");
    cr_expect_str_neq(pres, plain);
    char *ban = reply_of(&d, USER("Once upon a time") ",\"max_tokens\":60,\"logit_bias\":{\"317\":-100}}");
    cr_expect(!strstr(ban, " Lily"), "%s", ban);
    char *k1 = reply_of(&d, USER("Once upon a time") ",\"max_tokens\":60,\"temperature\":1.5,"
                        "\"top_k\":1,\"seed\":7}");
    cr_expect_str_eq(k1, plain);
    /* the next request without the fields is the plain greedy reply again */
    char *again = reply_of(&d, USER("Once upon a time") ",\"max_tokens\":60}");
    cr_expect_str_eq(again, plain);
    expect_error(&d, NULL, USER("x") ",\"logit_bias\":{\"512\":1}}", 400, NULL);
    answer a = request(&d, "POST", "/v1/chat/completions", NULL, USER("x") ",\"logit_bias\":{\"512\":1}}");
    cr_expect(strstr(a.body, "logit_bias"), "%s", a.body);
    free(a.raw);
    free(plain), free(pen), free(pres), free(ban), free(k1), free(again);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

static double metric(const kvpd_proc *p, const char *name)
{
    char *text = NULL;
    cr_assert_eq(h_get(p, "/metrics", NULL, &text), 200);
    double v = h_metric(text, name);
    free(text);
    return v;
}

Test(openai, a_client_leaving_mid_stream_cancels_its_turn)
{
    kvpd_proc d;
    /* Greedy stories260K ends its story within a second under the sanitizers, before the
     * client has left; the random-weight model never picks EOS and runs to its context
     * (4,096 tokens), seconds even in a release build. */
    char extra[1200];
    snprintf(extra, sizeof extra, "--model %s --max-tokens 100000 --budget 0",
             h_shared("models/llama-2-tiny-random.gguf"));
    cr_assert_eq(kvpd_start(&d, extra), 0);
    int fd = dial(&d);
    const char *body = USER("Once upon a time") ",\"max_tokens\":100000,\"stream\":true}";
    send_request(fd, "POST", "/v1/chat/completions", NULL, body, strlen(body));
    char buf[4096] = "";
    size_t got = 0;
    /* The role chunk, then the first content chunk. */
    while (!strstr(buf, "\"delta\":{\"content\":") && got < sizeof buf - 1) {
        ssize_t n = recv(fd, buf + got, sizeof buf - 1 - got, 0);
        cr_assert_gt(n, 0);
        got += (size_t)n;
        buf[got] = '\0';
    }
    cr_assert_eq(metric(&d, "kvpd_turns_cancelled_total"), 0);
    close(fd);
    double cancelled = 0;
    for (int i = 0; i < 100 && cancelled < 1; i++) {
        usleep(50000);
        cancelled = metric(&d, "kvpd_turns_cancelled_total");
    }
    cr_assert_eq(cancelled, 1, "the turn was not cancelled");
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(openai, a_reader_taking_one_byte_at_a_time_gets_the_whole_stream)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    int fd = dial(&d);
    int small = 1024;
    setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, sizeof small);
    const char *body = USER("Once upon a time") ",\"max_tokens\":64,\"stream\":true,"
                       "\"stream_options\":{\"include_usage\":true}}";
    send_request(fd, "POST", "/v1/chat/completions", NULL, body, strlen(body));
    usleep(300000);   /* the daemon fills the socket and waits */
    /* Meanwhile other requests are served. */
    answer other = request(&d, "GET", "/v1/models", NULL, "");
    cr_assert_eq(other.status, 200);
    free(other.raw);
    size_t cap = 1 << 20, n = 0;
    char *raw = malloc(cap);
    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        cr_assert_gt(poll(&pf, 1, 20000), 0, "the stream stalled");
        ssize_t r = recv(fd, raw + n, 1, 0);
        if (r <= 0)
            break;
        n++;
        if (n % 512 == 0)
            usleep(2000);
    }
    raw[n] = '\0';
    close(fd);
    char *b = strstr(raw, "\r\n\r\n");
    cr_assert(b);
    char reply[4096];
    const char *finish;
    json_t *u = parse_stream(b + 4, reply, sizeof reply, &finish);
    cr_assert_eq(json_integer_value(json_object_get(u, "completion_tokens")), 64);
    json_decref(u);
    free(raw);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(openai, thirty_two_concurrent_streams_all_finish)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, NULL), 0);
    int fds[32];
    char body[256];
    for (int i = 0; i < 32; i++) {
        fds[i] = dial(&d);
        snprintf(body, sizeof body, USER("Story number %d") ",\"max_tokens\":16,\"stream\":true,"
                 "\"stream_options\":{\"include_usage\":true}}", i);
        send_request(fds[i], "POST", "/v1/chat/completions", NULL, body, strlen(body));
    }
    char sids[32][40];
    for (int i = 0; i < 32; i++) {
        answer a = {0};
        a.raw = h_read_all(fds[i], 60000, NULL);
        close(fds[i]);
        sscanf(a.raw, "HTTP/1.1 %d", &a.status);
        cr_assert_eq(a.status, 200, "stream %d: %.300s", i, a.raw);
        a.body = strstr(a.raw, "\r\n\r\n") + 4;
        snprintf(sids[i], sizeof sids[i], "%s", header(&a, "x-session-id:"));
        for (int k = 0; k < i; k++)
            cr_assert_str_neq(sids[i], sids[k], "two requests shared a session");
        char reply[2048];
        const char *finish;
        json_t *u = parse_stream(a.body, reply, sizeof reply, &finish);
        cr_assert_eq(json_integer_value(json_object_get(u, "completion_tokens")), 16);
        json_decref(u);
        free(a.raw);
    }
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(openai, overloaded_is_429_with_retry_after)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--max-sessions 1 --max-tokens 100000 --budget 0"), 0);
    int fd = dial(&d);
    const char *body = USER("Once upon a time") ",\"max_tokens\":100000,\"stream\":true}";
    send_request(fd, "POST", "/v1/chat/completions", NULL, body, strlen(body));
    char buf[512];
    cr_assert_gt(recv(fd, buf, sizeof buf, 0), 0);   /* its turn runs */
    answer a = request(&d, "POST", "/v1/chat/completions", NULL, USER("Another story") "}");
    cr_assert_eq(a.status, 429, "%s", a.raw);
    cr_assert_geq(atoi(header(&a, "retry-after:")), 1, "%s", a.raw);
    cr_assert(strstr(a.body, "rate_limit_error"), "%s", a.body);
    free(a.raw);
    close(fd);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* A 503 in OpenAI's shape with a Retry-After. */
static void expect_503(const kvpd_proc *p, const char *method, const char *path, const char *body,
                       const char *why)
{
    answer a = request(p, method, path, NULL, body);
    cr_assert_eq(a.status, 503, "%s %s: %s", method, path, a.raw);
    cr_assert_geq(atoi(header(&a, "retry-after:")), 1, "%s", a.raw);
    json_t *j = json_loads(a.body, 0, NULL);
    cr_assert(j, "not JSON: %s", a.body);
    json_t *e = json_object_get(j, "error");
    cr_assert_str_eq(json_string_value(json_object_get(e, "type")), "service_unavailable", "%s", a.body);
    cr_assert(strstr(json_string_value(json_object_get(e, "message")), why), "%s", a.body);
    cr_assert(json_object_get(e, "param") && json_object_get(e, "code"), "%s", a.body);
    json_decref(j);
    free(a.raw);
}

/* While the model loads: the model file is a FIFO, so the load waits (in open) until the
 * test opens its other end; meanwhile the API answers 503 "loading". */
Test(openai, while_the_model_loads_the_api_answers_503_with_retry_after)
{
    /* The start stays in its loading phase while the snapshot store does not answer: a
     * "Redis" that takes the connection (the listen backlog) and never replies. */
    int lfd = socket(AF_INET, SOCK_STREAM, 0);
    cr_assert_geq(lfd, 0);
    struct sockaddr_in a = {.sin_family = AF_INET};
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t alen = sizeof a;
    cr_assert_eq(bind(lfd, (struct sockaddr *)&a, sizeof a), 0);
    cr_assert_eq(listen(lfd, 8), 0);
    cr_assert_eq(getsockname(lfd, (struct sockaddr *)&a, &alen), 0);
    char extra[256];
    snprintf(extra, sizeof extra, "--state-url redis://127.0.0.1:%d", ntohs(a.sin_port));
    kvpd_proc d;
    cr_assert_eq(kvpd_spawn(&d, extra), 0, "kvpd did not bind its port (log %s)", d.log);
    expect_503(&d, "POST", "/v1/chat/completions", USER("Once") ",\"max_tokens\":3}", "loading");
    expect_503(&d, "GET", "/v1/models", "", "loading");
    char *body = NULL;
    cr_assert_eq(h_get(&d, "/healthz", NULL, &body), 503);
    free(body);
    /* The load goes on: the store never answers its PING, so the start fails and the
     * daemon stops with status 1. */
    int status = -2;
    for (int i = 0; i < 3000 && d.pid > 0; i++) {
        int st;
        if (waitpid(d.pid, &st, WNOHANG) == d.pid) {
            status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
            d.pid = 0;
        }
        usleep(10000);
    }
    close(lfd);
    cr_assert_eq(status, 1, "kvpd did not stop after the failed load");
}

/* One answer with a Content-Length on a connection that stays open. */
static char *read_one(int fd)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (;;) {
        struct pollfd pf = {fd, POLLIN, 0};
        cr_assert_gt(poll(&pf, 1, 10000), 0, "no answer");
        ssize_t r = recv(fd, buf + n, cap - n - 1, 0);
        cr_assert_gt(r, 0, "closed before the answer");
        n += (size_t)r;
        buf[n] = '\0';
        char *end = strstr(buf, "\r\n\r\n");
        const char *cl = strcasestr(buf, "content-length:");
        if (end && cl && n >= (size_t)(end + 4 - buf) + (size_t)atoi(cl + 15))
            return buf;
    }
}

/* While the daemon drains: a connection opened before (new ones are closed at once) asks
 * while a long prefill unit still runs — the turn stops at its next step, and the
 * shutdown waits for it — and gets 503 "shutting down". */
Test(openai, while_the_daemon_stops_the_api_answers_503_with_retry_after)
{
    char dir[64], model[128], cmd[512];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(model, sizeof model, "%s/slow.gguf", dir);
    /* q8_0 prefill of some hundreds of tokens in one chunk: a unit of a second or more */
    snprintf(cmd, sizeof cmd, "%s synth --out %s --dim 768 --hidden 2048 --layers 4 --heads 12 "
             "--vocab 32000 --ctx 8192 --type q8_0 >/dev/null 2>&1", h_build("tools/kvp"), model);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    char extra[512];
    snprintf(extra, sizeof extra, "--model %s --chunk 4096 --budget 0 --max-body-bytes 1000000",
             model);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, extra), 0);
    int keep = dial(&d);
    const char *get = "GET /v1/models HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n";
    send_all(keep, get, strlen(get));
    char *first = read_one(keep);
    cr_assert(!strncmp(first, "HTTP/1.1 200", 12), "%s", first);
    free(first);

    size_t words = 200, len = 0;
    char *body = malloc(words * 8 + 128);
    len += (size_t)sprintf(body, "{\"max_tokens\":2,\"messages\":[{\"role\":\"user\",\"content\":\"");
    for (size_t i = 0; i < words; i++)
        len += (size_t)sprintf(body + len, "%s ", i % 3 ? "dog" : "ran");
    len += (size_t)sprintf(body + len, "\"}]}");
    int fd = dial(&d);
    send_request(fd, "POST", "/v1/chat/completions", NULL, body, len);
    free(body);
    /* The turn left the queue: its worker is in the prefill unit. */
    char *text = NULL;
    for (int i = 0; i < 200; i++) {
        free(text);
        text = NULL;
        cr_assert_eq(h_get(&d, "/metrics", NULL, &text), 200);
        if (h_metric(text, "kvpd_turns_running") == 1 && h_metric(text, "kvpd_queue_depth") == 0)
            break;
        usleep(10000);
    }
    cr_assert_eq(h_metric(text, "kvpd_turns_running"), 1, "%s", text);
    free(text);
    cr_assert_eq(kill(d.pid, SIGTERM), 0);
    usleep(50000);
    const char *post = "POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                       "Content-Type: application/json\r\nContent-Length: 40\r\n\r\n"
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"x\"}]}";
    send_all(keep, post, strlen(post));
    answer a = {0};
    a.raw = read_one(keep);
    sscanf(a.raw, "HTTP/1.1 %d", &a.status);
    a.body = strstr(a.raw, "\r\n\r\n") + 4;
    cr_assert_eq(a.status, 503, "%s", a.raw);
    cr_assert_geq(atoi(header(&a, "retry-after:")), 1, "%s", a.raw);
    cr_assert(strstr(a.body, "\"service_unavailable\"") && strstr(a.body, "shutting down"),
              "%s", a.body);
    free(a.raw);
    close(keep);
    close(fd);
    cr_assert_eq(kvpd_wait(&d, 30000), 0);
    h_rmdir(dir);
}

/* A conversation that is only on disk after a restart: the request that extends it finds
 * it by its transcript (the index read at start) and continues it from its snapshot. */
Test(openai, a_conversation_only_on_disk_after_a_restart_is_continued)
{
    char dir[64], extra[128];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(extra, sizeof extra, "--state-dir %s", dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, extra), 0);
    json_t *msgs = json_pack("[{s:s, s:s}]", "role", "user", "content", "Once upon a time");
    char sid[64] = "";
    int total = 0;
    for (int turn = 0; turn < 3; turn++) {
        if (turn == 2) {   /* a restart: nothing of the session is in memory */
            cr_assert_eq(kvpd_stop(&d, 10000), 0);
            cr_assert_eq(kvpd_start(&d, extra), 0);
            cr_assert(kvpd_log_has(&d, "1 conversation(s) in the transcript index"));
        }
        json_t *req = json_pack("{s:O, s:i}", "messages", msgs, "max_tokens", 6);
        char *body = json_dumps(req, 0);
        answer a = request(&d, "POST", "/v1/chat/completions", NULL, body);
        free(body);
        json_decref(req);
        cr_assert_eq(a.status, 200, "turn %d: %s", turn, a.raw);
        json_t *j = json_loads(a.body, 0, NULL);
        json_t *u = json_object_get(j, "usage");
        int prompt = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
        int cached = (int)json_integer_value(json_object_get(json_object_get(u, "prompt_tokens_details"),
                                                             "cached_tokens"));
        int prefilled = (int)json_integer_value(json_object_get(json_object_get(j, "kvpd"),
                                                                "prefilled_tokens"));
        if (turn == 0) {
            snprintf(sid, sizeof sid, "%s", header(&a, "x-session-id:"));
            cr_assert_eq(cached, 0);
        } else {
            cr_assert(sid[0] && !header(&a, "x-session-id:")[0], "turn %d: another session", turn);
            cr_assert_geq(cached, total - 1, "turn %d: the history was recomputed (cached %d of %d)",
                          turn, cached, total);
            cr_assert_leq(prefilled, 8, "turn %d: %d tokens prefilled", turn, prefilled);
        }
        cr_assert_eq(prompt, cached + prefilled);
        total = prompt + (int)json_integer_value(json_object_get(u, "completion_tokens"));
        const char *reply = json_string_value(json_object_get(json_object_get(
            json_array_get(json_object_get(j, "choices"), 0), "message"), "content"));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "assistant", "content", reply));
        json_array_append_new(msgs, json_pack("{s:s, s:s}", "role", "user", "content",
                                              turn ? "The end." : "The dog ran"));
        json_decref(j);
        free(a.raw);
    }
    /* A history nobody had is a new conversation, even with the index in place. */
    answer a = request(&d, "POST", "/v1/chat/completions", NULL,
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"},"
                       "{\"role\":\"assistant\",\"content\":\"never said\"},"
                       "{\"role\":\"user\",\"content\":\"hi\"}],\"max_tokens\":2}");
    cr_assert_eq(a.status, 200, "%s", a.raw);
    cr_assert_str_neq(header(&a, "x-session-id:"), sid);
    free(a.raw);
    json_decref(msgs);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(dir);
}
