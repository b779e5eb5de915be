/* Integration: conversations over /chat against a live kvpd with stories260K. */
#include <criterion/criterion.h>
#include <string.h>

#include "tests/daemon/harness.h"

#define BUDGET 64
#define CHUNK 16

static kvpd_proc d;

static void start(void)
{
    cr_assert_eq(kvpd_start(&d, NULL), 0, "kvpd did not start (log %s)", d.log);
}

static void stop(void)
{
    cr_expect_eq(kvpd_stop(&d, 10000), 0, "kvpd did not exit 0 on SIGTERM");
}

static json_int_t stat_of(json_t *done, const char *key)
{
    json_t *v = json_object_get(json_object_get(done, "stats"), key);
    cr_assert(json_is_number(v), "stats.%s missing", key);
    return json_is_integer(v) ? json_integer_value(v) : (json_int_t)json_number_value(v);
}

static const char *type_of(json_t *j)
{
    return json_string_value(json_object_get(j, "type"));
}

TestSuite(chat, .init = start, .fini = stop, .timeout = 90);

Test(chat, twenty_turns_prefill_only_new_tokens_and_bounded_cache)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(&c, "session", 5000);
    cr_assert(s);
    cr_assert(json_is_false(json_object_get(s, "resumed")));
    json_decref(s);
    static const char *lines[] = {"Once upon a time, there was a little dog.",
                                  "The dog liked to play in the park.",
                                  "One day, it saw a big red ball.",
                                  "Tom said hello to his friend."};
    json_int_t prev_transcript = 0;
    for (int turn = 1; turn <= 20; turn++) {
        char *tokens = NULL;
        json_t *done = h_turn(&c, lines[turn % 4], 32, &tokens);
        cr_assert(done, "turn %d got no answer", turn);
        cr_assert_str_eq(type_of(done), "done", "turn %d: %s", turn,
                         json_string_value(json_object_get(done, "message")));
        const char *reply = json_string_value(json_object_get(done, "reply"));
        cr_assert_str_eq(reply, tokens ? tokens : "", "turn %d: reply != streamed tokens", turn);
        json_int_t prompt = stat_of(done, "prompt_tokens");
        json_int_t prefilled = stat_of(done, "prefilled_tokens");
        json_int_t generated = stat_of(done, "generated_tokens");
        json_int_t transcript = stat_of(done, "transcript_tokens");
        json_int_t rows_max = stat_of(done, "cache_rows_max");
        cr_assert(prompt > 0);
        cr_assert_eq(prefilled, prompt, "turn %d: prefilled %lld != new tokens %lld", turn,
                     (long long)prefilled, (long long)prompt);
        /* The new tokens are this message (+1 when the last reply's final token was
         * never fed), never the transcript. */
        cr_assert_leq(prompt, transcript - prev_transcript - generated + 1);
        if (turn >= 2)
            cr_assert_lt(prefilled, transcript / 2 + 1, "turn %d re-prefilled the transcript", turn);
        cr_assert_leq(rows_max, BUDGET + CHUNK, "turn %d: %lld rows in a head", turn,
                      (long long)rows_max);
        cr_assert_leq(stat_of(done, "cache_rows"), BUDGET);
        cr_assert(stat_of(done, "cache_bytes") > 0);
        cr_assert(json_is_number(json_object_get(json_object_get(done, "stats"), "ttft_ms")));
        cr_assert(json_is_number(json_object_get(json_object_get(done, "stats"), "tokens_per_s")));
        prev_transcript = transcript;
        free(tokens);
        json_decref(done);
    }
    /* 20 turns went past stories260K's 512-token context. */
    cr_assert_gt(prev_transcript, 512);
    ws_close(&c);
}

Test(chat, sixteen_concurrent_sessions_three_turns_stats_agree)
{
    enum { N = 16, TURNS = 3 };
    ws_client c[N];
    long long generated = 0, prompt = 0, prefilled = 0;
    for (int i = 0; i < N; i++)
        cr_assert_eq(h_connect(&d, &c[i]), 0);
    for (int t = 0; t < TURNS; t++) {
        for (int i = 0; i < N; i++) {
            char msg[128];
            snprintf(msg, sizeof msg,
                     "{\"type\":\"message\",\"text\":\"Lily had %d red apples.\",\"max_tokens\":12}", i + t);
            cr_assert_eq(ws_send_text(&c[i], msg), 0);
        }
        for (int i = 0; i < N; i++) {
            json_t *done = h_expect(&c[i], "done", 30000);
            cr_assert(done, "session %d turn %d did not complete", i, t);
            generated += stat_of(done, "generated_tokens");
            prompt += stat_of(done, "prompt_tokens");
            prefilled += stat_of(done, "prefilled_tokens");
            json_decref(done);
        }
    }
    char *body = NULL;
    cr_assert_eq(h_get(&d, "/admin/stats", h_admin_token(&d), &body), 200);
    json_t *st = json_loads(body, 0, NULL);
    free(body);
    cr_assert(st);
    json_t *sessions = json_object_get(st, "sessions");
    cr_assert_eq(json_integer_value(json_object_get(sessions, "active")), N);
    cr_assert_eq(json_integer_value(json_object_get(sessions, "total")), N);
    json_t *tokens = json_object_get(st, "tokens");
    cr_assert_eq(json_integer_value(json_object_get(tokens, "out")), generated);
    cr_assert_eq(json_integer_value(json_object_get(tokens, "in")), prompt);
    cr_assert_eq(json_integer_value(json_object_get(st, "turns")), N * TURNS);
    json_t *list = json_object_get(st, "session_list");
    cr_assert_eq(json_array_size(list), N);
    for (size_t i = 0; i < json_array_size(list); i++)
        cr_assert_eq(json_integer_value(json_object_get(json_array_get(list, i), "turns")), TURNS);
    json_decref(st);

    cr_assert_eq(h_get(&d, "/metrics", NULL, &body), 200);
    cr_assert_eq(h_metric(body, "kvpd_generated_tokens_total"), (double)generated);
    cr_assert_eq(h_metric(body, "kvpd_prompt_tokens_total"), (double)prompt);
    cr_assert_eq(h_metric(body, "kvpd_prefilled_tokens_total"), (double)prefilled);
    cr_assert_eq(h_metric(body, "kvpd_turns_total"), N * TURNS);
    cr_assert_eq(h_metric(body, "kvpd_sessions_resident"), N);
    cr_assert_eq(h_metric(body, "kvpd_ttft_seconds_count"), N * TURNS);
    free(body);
    for (int i = 0; i < N; i++)
        ws_close(&c[i]);
}

Test(chat, first_message_without_hello_starts_a_session)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"The cat sat.\",\"max_tokens\":4}"), 0);
    json_t *s = h_expect(&c, "session", 5000);
    cr_assert(s);
    cr_assert_eq(strlen(json_string_value(json_object_get(s, "id"))), 32);
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 0);
    json_decref(s);
    json_t *done = h_expect(&c, "done", 10000);
    cr_assert(done);
    cr_assert_leq(stat_of(done, "generated_tokens"), 4);
    json_decref(done);
    ws_close(&c);
}

/* One message on a new connection; returns its done frame's reply (malloc'd). */
static char *reply_of(const char *frame)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, frame), 0);
    json_t *done = h_expect(&c, "done", 20000);
    cr_assert(done, "no done for %s", frame);
    char *r = strdup(json_string_value(json_object_get(done, "reply")));
    json_decref(done);
    ws_close(&c);
    return r;
}

/* The message's sampling fields reach the sampler: a seed makes a sampled reply
 * repeatable across sessions (another seed gives another), a stop string ends the reply
 * before it, and a bad value is refused naming its field. */
Test(chat, message_sampling_fields_take_effect)
{
    static const char *fmt = "{\"type\":\"message\",\"text\":\"The dog ran.\",\"max_tokens\":40,"
                             "\"temperature\":1.5,\"top_k\":50,\"seed\":%d}";
    char frame[256];
    snprintf(frame, sizeof frame, fmt, 7);
    char *a = reply_of(frame), *b = reply_of(frame);
    cr_assert_gt(strlen(a), 0);
    cr_expect_str_eq(a, b, "the same seed draws the same reply");
    int differ = 0;
    for (int seed = 8; seed < 12 && !differ; seed++) {
        snprintf(frame, sizeof frame, fmt, seed);
        char *c = reply_of(frame);
        differ = strcmp(a, c) != 0;
        free(c);
    }
    cr_expect(differ, "other seeds draw other replies");
    /* stop at a word of the greedy reply: the reply ends before it */
    char *g = reply_of("{\"type\":\"message\",\"text\":\"The dog ran.\",\"max_tokens\":40,"
                       "\"temperature\":0}");
    const char *sp = strchr(g + 1, ' ');
    cr_assert(sp && strlen(sp) > 3, "greedy reply with two words: %s", g);
    char word[16];
    snprintf(word, sizeof word, "%.3s", sp + 1);
    snprintf(frame, sizeof frame, "{\"type\":\"message\",\"text\":\"The dog ran.\","
             "\"max_tokens\":40,\"temperature\":0,\"stop\":[\"%s\"]}", word);
    char *cut = reply_of(frame);
    cr_expect_null(strstr(cut, word), "stop %s still in %s", word, cut);
    cr_expect_eq(strncmp(g, cut, strlen(cut)), 0, "cut reply %s is a prefix of %s", cut, g);
    cr_expect_lt(strlen(cut), strlen(g));
    free(a), free(b), free(g), free(cut);
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"x\",\"logit_bias\":{\"999999\":1}}"), 0);
    json_t *e = h_expect(&c, "error", 5000);
    cr_assert(e);
    cr_expect_str_eq(json_string_value(json_object_get(e, "code")), "bad_request");
    cr_expect_not_null(strstr(json_string_value(json_object_get(e, "message")), "logit_bias"),
                       "%s", json_string_value(json_object_get(e, "message")));
    json_decref(e);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"x\",\"n\":2}"), 0);
    e = h_expect(&c, "error", 5000);
    cr_assert(e);
    cr_expect_not_null(strstr(json_string_value(json_object_get(e, "message")), "\"n\""));
    json_decref(e);
    ws_close(&c);
}

Test(chat, resume_keeps_transcript_and_cache)
{
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\",\"session\":null}"), 0);
    json_t *s = h_expect(&c, "session", 5000);
    cr_assert(s);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    json_t *done = h_turn(&c, "Once upon a time there was a girl named Sue.", 16, NULL);
    cr_assert(done);
    json_decref(done);
    ws_close(&c);

    cr_assert_eq(h_connect(&d, &c), 0);
    char hello[128];
    snprintf(hello, sizeof hello, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(ws_send_text(&c, hello), 0);
    s = h_expect(&c, "session", 5000);
    cr_assert(s);
    cr_assert_str_eq(json_string_value(json_object_get(s, "id")), id);
    cr_assert(json_is_true(json_object_get(s, "resumed")));
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 1);
    json_t *hist = json_object_get(s, "history");
    cr_assert_eq(json_array_size(hist), 2);
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(hist, 0), "role")), "user");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(hist, 0), "text")),
                     "Once upon a time there was a girl named Sue.");
    cr_assert_str_eq(json_string_value(json_object_get(json_array_get(hist, 1), "role")), "assistant");
    json_decref(s);
    done = h_turn(&c, "She had a cat.", 8, NULL);
    cr_assert(done);
    cr_assert_str_eq(type_of(done), "done");
    cr_assert_lt(stat_of(done, "prefilled_tokens"), stat_of(done, "transcript_tokens") / 2);
    json_decref(done);
    ws_close(&c);
}

Test(chat, cancel_stops_generation_and_keeps_partial_reply)
{
    kvpd_proc *p = &d;
    ws_client c;
    cr_assert_eq(h_connect(p, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"message\",\"text\":\"Once upon a time\",\"max_tokens\":64}"), 0);
    json_t *tok = h_expect(&c, "token", 10000);
    cr_assert(tok);
    json_decref(tok);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"cancel\"}"), 0);
    json_t *done = h_expect(&c, "done", 10000);
    cr_assert(done);
    const char *stop = json_string_value(json_object_get(json_object_get(done, "stats"), "stop"));
    /* The turn may have finished before the cancel arrived; usually it did not. */
    if (!strcmp(stop, "cancel"))
        cr_assert_lt(stat_of(done, "generated_tokens"), 64);
    json_int_t transcript = stat_of(done, "transcript_tokens");
    json_int_t generated = stat_of(done, "generated_tokens");
    cr_assert_geq(generated, 1);
    json_decref(done);
    /* The partial reply is part of the conversation: the next turn builds on it. */
    done = h_turn(&c, "The end.", 4, NULL);
    cr_assert(done);
    cr_assert_str_eq(type_of(done), "done");
    cr_assert_gt(stat_of(done, "transcript_tokens"), transcript);
    json_decref(done);
    ws_close(&c);
}

/* A qwen2-shaped model (Q/K/V biases, NeoX RoPE, tied output; `kvp synth --arch qwen2`)
 * through turns that pass its 128-position context (the context shift re-rotates NeoX
 * keys), a restart, and a resumed turn that reuses the restored cache. */
Test(chat_arch, qwen2_turns_past_the_context_and_a_restart, .timeout = 120)
{
    char dir[64], model[128], cmd[512], extra[512];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(model, sizeof model, "%s/qwen2.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s synth --out %s --arch qwen2 --tied --dim 64 --hidden 128 "
             "--layers 2 --heads 4 --kv-heads 2 --vocab 512 --ctx 128 --seed 5 >/dev/null 2>&1",
             h_build("tools/kvp"), model);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(extra, sizeof extra, "--model %s --policy snapkv --budget 48 --chunk 8 "
             "--state-dir %s", model, dir);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, extra), 0, "kvpd did not start (log %s)", p.log);
    cr_expect(kvpd_log_has(&p, "(qwen2, plain, 2 layers, context 128)"), "log %s", p.log);
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    cr_assert_eq(ws_send_text(&c, "{\"type\":\"hello\"}"), 0);
    json_t *s = h_expect(&c, "session", 5000);
    cr_assert(s);
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    json_int_t transcript = 0;
    for (int turn = 1; turn <= 6; turn++) {
        json_t *done = h_turn(&c, "Tell me about the weather today, please.", 24, NULL);
        cr_assert(done, "turn %d got no answer", turn);
        cr_assert_str_eq(type_of(done), "done", "turn %d: %s", turn,
                         json_string_value(json_object_get(done, "message")));
        cr_assert_eq(stat_of(done, "prefilled_tokens"), stat_of(done, "prompt_tokens"),
                     "turn %d prefilled more than its new tokens", turn);
        cr_assert_gt(stat_of(done, "generated_tokens"), 0);
        cr_assert_leq(stat_of(done, "cache_rows_max"), 48 + 8);
        transcript = stat_of(done, "transcript_tokens");
        json_decref(done);
    }
    cr_assert_gt(transcript, 128, "the turns never passed the context (%lld tokens)",
                 (long long)transcript);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);

    cr_assert_eq(kvpd_start(&p, extra), 0, "kvpd did not restart (log %s)", p.log);
    cr_assert_eq(h_connect(&p, &c), 0);
    char hello[128];
    snprintf(hello, sizeof hello, "{\"type\":\"hello\",\"session\":\"%s\"}", id);
    cr_assert_eq(ws_send_text(&c, hello), 0);
    s = h_expect(&c, "session", 5000);
    cr_assert(s);
    cr_assert(json_is_true(json_object_get(s, "resumed")));
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 6);
    json_decref(s);
    json_t *done = h_turn(&c, "And tomorrow?", 8, NULL);
    cr_assert(done);
    cr_assert_str_eq(type_of(done), "done", "%s", json_string_value(json_object_get(done, "message")));
    cr_assert_eq(stat_of(done, "prefilled_tokens"), stat_of(done, "prompt_tokens"),
                 "the restored cache was not reused");
    json_decref(done);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
    cr_expect(!kvpd_log_has(&p, "its cache has another shape"));
    h_rmdir(dir);
}

/* One session's hello (a new one when id is empty, else resuming id); the session frame. */
static json_t *say_hello(ws_client *c, const char *id)
{
    char msg[128];
    snprintf(msg, sizeof msg, *id ? "{\"type\":\"hello\",\"session\":\"%s\"}" : "{\"type\":\"hello\"}", id);
    cr_assert_eq(ws_send_text(c, msg), 0);
    json_t *s = h_expect(c, "session", 5000);
    cr_assert(s, "no session frame");
    return s;
}

/* A gemma3-shaped model (`kvp synth --arch gemma3`: 5 of 6 layers windowed at 16 rows)
 * chats over the websocket for 5 turns with a budget smaller than the conversation: the
 * global layer is evicted to the budget, the windowed ones hold their window; after a
 * restart the session resumes from its snapshot and its next reply equals the reply of
 * the same conversation run without a restart (the windows came back exactly). */
Test(chat_arch, gemma3_windows_and_eviction_across_a_restart, .timeout = 120)
{
    char dir[64], model[128], cmd[512], extra[512];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(model, sizeof model, "%s/gemma3.gguf", dir);
    snprintf(cmd, sizeof cmd, "%s synth --out %s --arch gemma3 --tied --dim 64 --hidden 128 "
             "--layers 6 --heads 4 --kv-heads 2 --vocab 512 --ctx 512 --window 16 --seed 9 "
             ">/dev/null 2>&1", h_build("tools/kvp"), model);
    cr_assert_eq(system(cmd), 0, "%s", cmd);
    snprintf(extra, sizeof extra, "--model %s --policy h2o --budget 40 --chunk 8 --state-dir %s",
             model, dir);
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, extra), 0, "kvpd did not start (log %s)", p.log);
    cr_expect(kvpd_log_has(&p, "(gemma3, "), "log %s", p.log);
    static const char *const said[] = {"Tell me about the weather today, please.",
                                       "What should I wear outside?", "Is it going to rain?",
                                       "And what about the wind?", "Thank you, good night."};
    ws_client c;
    cr_assert_eq(h_connect(&p, &c), 0);
    json_t *s = say_hello(&c, "");
    char id[64];
    snprintf(id, sizeof id, "%s", json_string_value(json_object_get(s, "id")));
    json_decref(s);
    json_int_t transcript = 0;
    for (int turn = 0; turn < 5; turn++) {
        json_t *done = h_turn(&c, said[turn], 24, NULL);
        cr_assert(done, "turn %d got no answer", turn);
        cr_assert_str_eq(type_of(done), "done", "turn %d: %s", turn,
                         json_string_value(json_object_get(done, "message")));
        cr_assert_eq(stat_of(done, "prefilled_tokens"), stat_of(done, "prompt_tokens"));
        cr_assert_leq(stat_of(done, "cache_rows_max"), 40 + 8, "turn %d", turn);
        transcript = stat_of(done, "transcript_tokens");
        json_decref(done);
    }
    cr_assert_gt(transcript, 40 + 8, "the conversation (%lld tokens) never passed the budget",
                 (long long)transcript);
    ws_close(&c);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);

    cr_assert_eq(kvpd_start(&p, extra), 0, "kvpd did not restart (log %s)", p.log);
    cr_assert_eq(h_connect(&p, &c), 0);
    s = say_hello(&c, id);
    cr_assert(json_is_true(json_object_get(s, "resumed")));
    cr_assert_eq(json_integer_value(json_object_get(s, "turns")), 5);
    json_decref(s);
    json_t *resumed = h_turn(&c, "See you tomorrow.", 12, NULL);
    cr_assert(resumed);
    cr_assert_str_eq(type_of(resumed), "done", "%s",
                     json_string_value(json_object_get(resumed, "message")));
    cr_assert_eq(stat_of(resumed, "prefilled_tokens"), stat_of(resumed, "prompt_tokens"),
                 "the restored cache was not reused");
    ws_close(&c);
    /* the same six turns in one run */
    ws_client r;
    cr_assert_eq(h_connect(&p, &r), 0);
    json_decref(say_hello(&r, ""));
    for (int turn = 0; turn < 5; turn++)
        json_decref(h_turn(&r, said[turn], 24, NULL));
    json_t *ref = h_turn(&r, "See you tomorrow.", 12, NULL);
    cr_assert(ref);
    cr_expect_str_eq(json_string_value(json_object_get(resumed, "reply")),
                     json_string_value(json_object_get(ref, "reply")));
    json_decref(ref);
    json_decref(resumed);
    ws_close(&r);
    cr_assert_eq(kvpd_stop(&p, 10000), 0);
    cr_expect(!kvpd_log_has(&p, "its cache has another shape"));
    h_rmdir(dir);
}
