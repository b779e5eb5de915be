/* A chat completion's other choices (n > 1, docs/openai.md): one hub client per choice
 * after the first, whose turns the hub forks from the first one's prefilled cache
 * (kvp_hub_chat_choices). Their events become choices 1..n-1 of the answer: streamed,
 * each chunk carries its choice's `index` and each choice gets its role chunk and one
 * finish_reason; whole, the answer waits for the last choice. usage counts the prompt
 * once and the completion tokens of every choice. A choice's error is the request's.
 * Loop thread. */
#include <jansson.h>
#include <stdlib.h>
#include <string.h>

#include "web/openai_impl.h"

/* The first choice's figures with every choice's completion and prefilled tokens: the
 * prompt counts once (the others' prefill is its last token, run again for their own
 * logits). */
static kvp_turn_stats summed(const kvpd_oai *o)
{
    kvp_turn_stats st = o->first;
    for (int i = 0; i < o->n_choices - 1; i++) {
        st.generated_tokens += o->more[i].generated;
        st.prefilled_tokens += o->more[i].prefilled;
    }
    return st;
}

/* The answer, once every choice is done. */
static void finish(kvpd_conn *c)
{
    kvpd_oai *o = c->oai;
    if (!o->first_done)
        return;
    for (int i = 0; i < o->n_choices - 1; i++)
        if (!o->more[i].done)
            return;
    if (!o->req.stream) {
        json_t *j = o->whole, *choices = json_object_get(j, "choices");
        o->whole = NULL;
        for (int i = 0; i < o->n_choices - 1; i++) {
            json_array_append_new(choices, o->more[i].choice);
            o->more[i].choice = NULL;
        }
        kvp_turn_stats st = summed(o);
        json_object_set_new(j, "usage", kvpd_oai_usage(&st));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(kvpd_oai_shown_session(o), o->durable, &st));
        kvpd_oai_answer(c, 200, j);
        return;
    }
    if (o->req.include_usage) {
        json_t *j = json_pack("{s:s, s:s, s:I, s:s, s:[]}", "id", o->id, "object",
                              "chat.completion.chunk", "created", (json_int_t)o->created,
                              "model", o->model, "choices");
        kvp_turn_stats st = summed(o);
        json_object_set_new(j, "usage", kvpd_oai_usage(&st));
        json_object_set_new(j, "kvpd", kvpd_oai_kvpd_stats(kvpd_oai_shown_session(o), o->durable, &st));
        kvpd_oai_sse(c, NULL, j);
    }
    kvpd_oai_queue(c, KVPD_OAI_SSE_DONE, strlen(KVPD_OAI_SSE_DONE));
    o->ended = 1;
}

static json_t *chunk(const kvpd_oai *o, json_t *choices)
{
    kvpd_oai_meta m = {o->id, o->created, o->model};
    return kvpd_oai_chunk(&m, choices);
}

/* Streaming: the choice's role chunk, before its first content. */
static void choice_start(kvpd_oai_choice *ch)
{
    kvpd_conn *c = ch->c;
    kvpd_oai_stream_start(c);
    if (ch->started)
        return;
    ch->started = 1;
    kvpd_oai_sse(c, NULL, chunk(c->oai, kvpd_oai_chunk_at(kvpd_oai_chunk_role(), ch->index)));
}

static void choice_done(kvpd_oai_choice *ch, const kvp_hub_event *ev)
{
    kvpd_conn *c = ch->c;
    kvpd_oai *o = c->oai;
    const kvp_turn_stats *st = ev->stats;
    const char *finish_reason = kvpd_oai_finish_reason(st, 0);
    ch->done = 1;
    ch->generated = st->generated_tokens;
    ch->prefilled = st->prefilled_tokens;
    if (o->req.stream) {
        choice_start(ch);
        int top = ev->logprobs_top;
        kvp_reasoning_stream *rs = o->reasoning ? &ch->rs : NULL;
        if (o->req.turn.logprobs && ev->n_logprobs > ch->lp_sent)   /* the last tokens' */
            kvpd_oai_stream_text(c, ch->index, rs, "", 0, 1,
                                 ev->logprobs + (size_t)ch->lp_sent * (size_t)(1 + top),
                                 ev->n_logprobs - ch->lp_sent, top, &ch->lp_sent);
        else if (rs)   /* what the split held back */
            kvpd_oai_stream_text(c, ch->index, rs, "", 0, 1, NULL, 0, top, &ch->lp_sent);
        kvpd_oai_sse(c, NULL, chunk(o, kvpd_oai_chunk_at(kvpd_oai_chunk_finish(finish_reason, st),
                                                         ch->index)));
    } else {
        json_t *lp = o->req.turn.logprobs
                     ? json_pack("{s:o}", "content",
                                 kvpd_oai_logprobs_content(ev->logprobs, ev->n_logprobs,
                                                           ev->logprobs_top))
                     : json_null();
        int calls;
        ch->choice = kvpd_oai_with_shaped(
            json_pack("{s:i, s:o, s:o, s:s}", "index", ch->index, "message",
                      kvpd_oai_message(o, NULL, ev->text, ev->len, &calls), "logprobs", lp,
                      "finish_reason", finish_reason), st, "max_tokens");
    }
    finish(c);
}

static void on_choice_event(void *ctx, const kvp_hub_event *ev)
{
    kvpd_oai_choice *ch = ctx;
    kvpd_conn *c = ch->c;
    kvpd_oai *o = c->oai;
    if (!o || o->ended || ch->done)
        return;
    switch (ev->type) {
    case KVP_HUB_SESSION:   /* a fork of the first choice's: the request names that one */
        break;
    case KVP_HUB_TOKEN:
        if (o->req.stream) {
            choice_start(ch);
            kvpd_oai_stream_text(c, ch->index, o->reasoning ? &ch->rs : NULL, ev->text, ev->len, 0,
                                 ev->logprobs, ev->n_logprobs, ev->logprobs_top, &ch->lp_sent);
        }
        break;
    case KVP_HUB_DONE:
        if (!strcmp(ev->stats->stop, "cancel"))
            kvpd_oai_cut(c);
        else
            choice_done(ch, ev);
        break;
    case KVP_HUB_ERROR:
        kvpd_oai_hub_error(c, ev);
        break;
    case KVP_HUB_RESPONSE:   /* choices store no responses */
        break;
    }
}

int kvpd_oai_choices_open(kvpd_conn *c, int n, kvp_hub_client **more)
{
    kvpd_oai *o = c->oai;
    if (!(o->more = calloc((size_t)(n - 1), sizeof *o->more))) {
        kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
        return -1;
    }
    o->n_choices = n;
    for (int i = 0; i < n - 1; i++) {
        kvpd_oai_choice *ch = &o->more[i];
        ch->c = c;
        ch->index = i + 1;
        ch->rs.opened = o->rs.opened;   /* each choice's reply starts as the first's */
        if (!(ch->client = kvp_hub_client_new(c->w->hub, on_choice_event, ch))) {
            kvpd_oai_fail(c, KVPD_OAI_E_SERVER, NULL, "out of memory");
            return -1;
        }
        kvp_hub_client_set_tenant(ch->client, c->tenant);
        more[i] = ch->client;
    }
    return 0;
}

void kvpd_oai_choices_first_done(kvpd_conn *c, json_t *whole, const kvp_turn_stats *st)
{
    kvpd_oai *o = c->oai;
    o->first_done = 1;
    o->first = *st;
    json_decref(o->whole);
    o->whole = whole;
    finish(c);
}

void kvpd_oai_choices_close(kvpd_oai *o)
{
    for (int i = 0; o->more && i < o->n_choices - 1; i++) {
        if (o->more[i].client)
            kvp_hub_close(o->more[i].client);
        json_decref(o->more[i].choice);
        kvp_reasoning_free(&o->more[i].rs);
    }
    free(o->more);
    o->more = NULL;
    json_decref(o->whole);
    o->whole = NULL;
}
