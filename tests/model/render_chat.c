/* Test helper for tests/tokref/templates.mjs: renders a conversation with
 * model/template.c and prints {"render": [...], "transcript": [...]}.
 *   render_chat MODEL.gguf FORMAT < {"system": "...", "messages": [{"role", "content"}...]}
 * render: kvp_template_render of the conversation (ending with a user message: the
 * generation prompt last). transcript: the tokens a session accumulates turn by turn —
 * kvp_template_turn for each user message, then as the reply the tokens the template's
 * own rendering puts between the generation prompt and the reply's end marker (the
 * marker included), as a model that reproduces its template generates them. When the
 * model's Jinja template renders (t.jinja), "render" is its rendering and the transcript
 * is the family's (kvp_template_turn), checked against the family's own rendering: a
 * Jinja template need not be prefix-stable (Qwen3 drops the empty think block of earlier
 * replies), the family's turns must be. Exits 1
 * with a message if a turn's transcript is not a prefix of the rendering. FORMAT "" =
 * detect from the model's tokenizer.chat_template. */
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "model/template.h"

static void print_ids(const char *key, const int *ids, int n, int last)
{
    printf("\"%s\": [", key);
    for (int i = 0; i < n; i++)
        printf(i ? ",%d" : "%d", ids[i]);
    printf("]%s", last ? "" : ", ");
}

static int die(const char *msg)
{
    fprintf(stderr, "render_chat: %s\n", msg);
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3)
        return die("usage: render_chat MODEL FORMAT < conversation.json");
    kvp_model m;
    char err[512];
    if (kvp_model_load(&m, argv[1], NULL, err, sizeof err))
        return die(err);
    kvp_template t;
    char note[256];
    int trc = kvp_template_init(&t, &m, argv[2], note, sizeof note);
    if (trc < 0)
        return die(note[0] ? note : "template init");
    if (trc > 0)
        fprintf(stderr, "render_chat: note: %s\n", note);
    json_error_t je;
    json_t *j = json_loadf(stdin, 0, &je);
    json_t *msgs = json_object_get(j, "messages");
    if (!json_is_array(msgs))
        return die("no messages");
    const char *sys = json_string_value(json_object_get(j, "system"));
    size_t sl = sys ? strlen(sys) : 0;
    int n = (int)json_array_size(msgs);
    kvp_chat_msg *cm = calloc((size_t)n + 1, sizeof *cm);
    for (int i = 0; i < n; i++) {
        json_t *mj = json_array_get(msgs, (size_t)i);
        cm[i].user = !strcmp(json_string_value(json_object_get(mj, "role")) ?: "", "user");
        cm[i].text = json_string_value(json_object_get(mj, "content")) ?: "";
        cm[i].len = strlen(cm[i].text);
    }
    int *full;
    int nf = kvp_template_render(&t, sys, sl, cm, n, &full);
    if (nf < 0)
        return die("render failed");

    kvp_template fam = t;
    fam.jinja = NULL;
    int *famfull, nff = kvp_template_render(&fam, sys, sl, cm, n, &famfull);
    if (nff < 0)
        return die("family render failed");
    free(famfull);
    int *tr = malloc(sizeof *tr * ((size_t)(nf > nff ? nf : nff) * 4 + 64)), nt = 0;
    for (int k = 0; k < n; k += 2) {
        int *turn;
        int nturn = kvp_template_turn(&fam, sys, sl, k == 0, 0, cm[k].text, cm[k].len, &turn);
        if (nturn < 0)
            return die("turn failed");
        memcpy(tr + nt, turn, sizeof *tr * (size_t)nturn);
        nt += nturn;
        free(turn);
        int *upto;
        int nu = kvp_template_render(&fam, sys, sl, cm, k + 1, &upto);
        if (nu != nt || memcmp(upto, tr, sizeof *tr * (size_t)nt)) {
            fprintf(stderr, "render_chat: after user message %d the transcript (%d tokens) "
                    "is not the rendering (%d tokens)\n", k, nt, nu);
            return 1;
        }
        free(upto);
        if (k + 1 >= n)
            break;
        /* The reply as the template renders it, up to and with its end marker. */
        int *withreply;
        int nw = kvp_template_render(&fam, sys, sl, cm, k + 2, &withreply);
        if (nw < nu || memcmp(withreply, tr, sizeof *tr * (size_t)nt))
            return die("the rendering with the reply does not extend the one without");
        int i = nu;
        while (i < nw && !kvp_template_is_stop(&fam, withreply[i]))
            tr[nt++] = withreply[i++];
        if (i == nw)
            return die("no end marker after the reply");
        tr[nt++] = withreply[i];   /* kept, as the session keeps it */
        free(withreply);
    }
    printf("{");
    print_ids("render", full, nf, 0);
    print_ids("transcript", tr, nt, 1);
    printf(", \"jinja\": %s}\n", t.jinja ? "true" : "false");
    free(full);
    kvp_template_free(&t);
    free(tr);
    free(cm);
    json_decref(j);
    kvp_model_free(&m);
    return 0;
}
