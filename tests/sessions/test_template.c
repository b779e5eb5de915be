/* sessions/template.c: each chat format's turn tokens, built on tok512 plus the marker
 * pieces a chat model's vocabulary carries (appended to a copy of tok512.bin). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "model/tokenizer.h"
#include "sessions/template.h"

static const char *markers[] = {"<|im_start|>", "<|im_end|>", "<|start_header_id|>",
                                "<|end_header_id|>", "<|eot_id|>"};
#define N_MARKERS 5

static kvp_model m;

static const char *shared(const char *rel)
{
    static char buf[1024];
    const char *root = getenv("KVP_SHARED");
    snprintf(buf, sizeof buf, "%s/%s", root ? root : "../shared", rel);
    return buf;
}

static void load(void)
{
    memset(&m, 0, sizeof m);
    FILE *in = fopen(shared("models/tok512.bin"), "rb");
    cr_assert(in);
    char path[] = "/tmp/kvpd-tok-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    FILE *out = fdopen(fd, "wb");
    char buf[8192];
    size_t n;
    int first = 1;
    while ((n = fread(buf, 1, sizeof buf, in)) > 0) {
        if (first) {   /* max_token_length must cover the markers */
            int max_len = 32;
            memcpy(buf, &max_len, sizeof max_len);
            first = 0;
        }
        cr_assert_eq(fwrite(buf, 1, n, out), n);
    }
    fclose(in);
    for (int i = 0; i < N_MARKERS; i++) {
        float score = -1e9f;   /* never produced by merges */
        int len = (int)strlen(markers[i]);
        fwrite(&score, sizeof score, 1, out);
        fwrite(&len, sizeof len, 1, out);
        fwrite(markers[i], 1, (size_t)len, out);
    }
    fclose(out);
    char err[256];
    cr_assert_eq(kvp_tokenizer_load_file(&m.tok, path, 512 + N_MARKERS, err, sizeof err), 0, "%s", err);
    unlink(path);
}

static void unload(void)
{
    kvp_tokenizer_free(&m.tok);
}

TestSuite(template, .init = load, .fini = unload);

/* The text the tokens stand for, as the model would print it. */
static char *render(const kvp_template *t, const int *ids, int n, int prev)
{
    char *s = calloc(1, 4096);
    size_t o = 0;
    for (int i = 0; i < n; i++) {
        size_t len = 0;
        const char *p = kvp_tokenizer_piece(t->tok, prev, ids[i], &len);
        if (ids[i] == t->bos)
            p = "<s>", len = 3;
        else if (ids[i] == t->eos)
            p = "</s>", len = 4;
        memcpy(s + o, p, len);
        o += len;
        prev = ids[i];
    }
    return s;
}

Test(template, plain_continuation)
{
    m.chat_format = KVP_CHAT_PLAIN;
    kvp_template t;
    cr_assert_eq(kvp_template_init(&t, &m), 0);
    int *ids;
    int n = kvp_template_turn(&t, 1, 0, "Once upon a time", 16, &ids);
    cr_assert_gt(n, 2);
    cr_assert_eq(ids[0], t.bos);
    char *s = render(&t, ids, n, -1);
    cr_assert_str_eq(s, "<s>Once upon a time");
    free(s);
    free(ids);
    n = kvp_template_turn(&t, 0, 1, "The end", 7, &ids);
    cr_assert_neq(ids[0], t.bos);
    s = render(&t, ids, n, 100);
    cr_assert_str_eq(s, " The end");
    free(s);
    free(ids);
    cr_assert(kvp_template_is_stop(&t, t.eos));
    cr_assert(kvp_template_is_stop(&t, t.bos));
    cr_assert_not(kvp_template_keeps_stop(&t));
}

Test(template, chatml)
{
    m.chat_format = KVP_CHAT_CHATML;
    kvp_template t;
    cr_assert_eq(kvp_template_init(&t, &m), 0);
    cr_assert_eq(t.format, KVP_CHAT_CHATML);
    int *ids;
    int n = kvp_template_turn(&t, 1, 0, "Hi there", 8, &ids);
    char *s = render(&t, ids, n, -1);
    cr_assert_str_eq(s, "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    free(ids);
    /* A reply cut short gets its end marker before the next message. */
    n = kvp_template_turn(&t, 0, 1, "More", 4, &ids);
    s = render(&t, ids, n, -1);
    cr_assert_str_eq(s, "<|im_end|>\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    free(ids);
    n = kvp_template_turn(&t, 0, 0, "More", 4, &ids);
    s = render(&t, ids, n, -1);
    cr_assert_str_eq(s, "\n<|im_start|>user\nMore<|im_end|>\n<|im_start|>assistant\n");
    free(s);
    free(ids);
    cr_assert(kvp_template_is_stop(&t, t.close));
    cr_assert(kvp_template_keeps_stop(&t));
}

Test(template, llama2)
{
    m.chat_format = KVP_CHAT_LLAMA2;
    kvp_template t;
    cr_assert_eq(kvp_template_init(&t, &m), 0);
    int *ids;
    int n = kvp_template_turn(&t, 1, 0, "Hi", 2, &ids);
    char *s = render(&t, ids, n, -1);
    cr_assert_str_eq(s, "<s>[INST] Hi [/INST]");
    free(s);
    free(ids);
    n = kvp_template_turn(&t, 0, 1, "Yo", 2, &ids);
    s = render(&t, ids, n, -1);
    cr_assert_str_eq(s, "</s><s>[INST] Yo [/INST]");
    free(s);
    free(ids);
}

Test(template, llama3)
{
    m.chat_format = KVP_CHAT_LLAMA3;
    kvp_template t;
    cr_assert_eq(kvp_template_init(&t, &m), 0);
    int *ids;
    int n = kvp_template_turn(&t, 1, 0, "Hi", 2, &ids);
    char *s = render(&t, ids, n, -1);
    cr_assert_str_eq(s, "<s><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
                        "<|start_header_id|>assistant<|end_header_id|>\n\n");
    free(s);
    free(ids);
    cr_assert(kvp_template_is_stop(&t, t.eot));
}

Test(template, the_files_end_of_turn_token_stops_every_format)
{
    enum kvp_chat_format formats[] = {KVP_CHAT_PLAIN, KVP_CHAT_CHATML, KVP_CHAT_LLAMA2,
                                      KVP_CHAT_LLAMA3};
    for (size_t i = 0; i < sizeof formats / sizeof formats[0]; i++) {
        m.chat_format = formats[i];
        m.tok.eot_id = 300;
        kvp_template t;
        kvp_template_init(&t, &m);
        cr_expect(kvp_template_is_stop(&t, 300), "format %d", formats[i]);
        cr_expect(!kvp_template_is_stop(&t, 301), "format %d", formats[i]);
        m.tok.eot_id = -1;
        kvp_template_init(&t, &m);
        cr_expect(!kvp_template_is_stop(&t, 300), "format %d", formats[i]);
    }
    m.chat_format = KVP_CHAT_PLAIN;
}

Test(template, missing_markers_fall_back_to_plain)
{
    kvp_tokenizer_free(&m.tok);
    char err[256];
    cr_assert_eq(kvp_tokenizer_load_file(&m.tok, shared("models/tok512.bin"), 512, err, sizeof err), 0);
    m.chat_format = KVP_CHAT_CHATML;
    kvp_template t;
    cr_assert_eq(kvp_template_init(&t, &m), 1);
    cr_assert_eq(t.format, KVP_CHAT_PLAIN);
}
