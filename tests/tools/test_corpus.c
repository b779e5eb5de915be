/* tools/corpus.c: the token streams of the offline tools (plain text, chat conversations
 * rendered with the model's template, lines of token ids), a part of the file counted
 * from its own line, errors naming file and line, and the sequences cut from a stream. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/model/testutil.h"
#include "tools/corpus.h"

static kvp_model g_model;

static void load(void)
{
    char err[256];
    cr_assert_eq(kvp_model_load(&g_model, tu_shared("models/stories260K.bin"), NULL, err,
                                sizeof err), 0, "%s", err);
}

static void unload(void)
{
    kvp_model_free(&g_model);
}

Test(corpus, sequences_cut_from_a_stream)
{
    cr_assert_eq(kvp_corpus_count(100, 10, 1), 11, "BOS then 9 tokens: 100 / 9");
    cr_assert_eq(kvp_corpus_count(100, 10, -1), 10, "no BOS: 10 tokens each");
    cr_assert_eq(kvp_corpus_count(8, 10, 1), 0);
    int ids[20], out[5];
    for (int i = 0; i < 20; i++)
        ids[i] = 100 + i;
    kvp_corpus_sequence(ids, 2, 5, 7, out);
    int want[] = {7, 108, 109, 110, 111};
    cr_assert_arr_eq(out, want, sizeof want);
    kvp_corpus_sequence(ids, 3, 5, -1, out);
    int want2[] = {115, 116, 117, 118, 119};
    cr_assert_arr_eq(out, want2, sizeof want2);
}

Test(corpus, a_file_read_whole)
{
    const char *path = tu_write_tmp("one\ntwo\n", 8);
    size_t len = 0;
    char *t = kvp_corpus_read(path, &len);
    cr_assert(t);
    cr_assert_eq(len, 8);
    cr_assert_str_eq(t, "one\ntwo\n", "NUL-terminated");
    free(t);
    errno = 0;
    cr_assert_null(kvp_corpus_read("/nonexistent/corpus.txt", &len));
    cr_assert_eq(errno, ENOENT);
    tu_remove_tmp_files();
}

/* Token ids need only the vocabulary's size. */
Test(corpus, lines_of_token_ids)
{
    kvp_model m;
    memset(&m, 0, sizeof m);
    m.cfg.vocab_size = 512;
    const char *text = "1 2 3\n\n 511\t0\r\n";
    int *ids = NULL;
    char err[256] = "";
    long n = kvp_corpus_tokens(&m, "ids.txt", text, 0, strlen(text), KVP_CORPUS_IDS, &ids, err,
                               sizeof err);
    cr_assert_eq(n, 5, "%s", err);
    int want[] = {1, 2, 3, 511, 0};
    cr_assert_arr_eq(ids, want, sizeof want);
    free(ids);
    /* a part of the file: counted from its own line */
    const char *bad = "1 2\n3 4\n5 512\n";
    ids = NULL;
    cr_assert_eq(kvp_corpus_tokens(&m, "ids.txt", bad, 4, strlen(bad), KVP_CORPUS_IDS, &ids,
                                   err, sizeof err), -1);
    cr_assert_null(ids);
    cr_assert(strstr(err, "ids.txt:3:"), "%s", err);
    cr_assert(strstr(err, "0..511"), "%s", err);
    const char *junk = "7 x8\n";
    cr_assert_eq(kvp_corpus_tokens(&m, "j", junk, 0, strlen(junk), KVP_CORPUS_IDS, &ids, err,
                                   sizeof err), -1);
    cr_assert(strstr(err, "j:1:"), "%s", err);
    const char *glued = "12a\n";
    cr_assert_eq(kvp_corpus_tokens(&m, "g", glued, 0, strlen(glued), KVP_CORPUS_IDS, &ids, err,
                                   sizeof err), -1);
}

Test(corpus, plain_text_and_conversations, .init = load, .fini = unload)
{
    const char *text = "Once upon a time there was a dog.\nThe dog was happy.\n";
    int *a = NULL, *b = NULL;
    char err[256] = "";
    long na = kvp_corpus_tokens(&g_model, "t", text, 0, strlen(text), 0, &a, err, sizeof err);
    cr_assert_gt(na, 8, "%s", err);
    /* text[0..at), the first line alone, is how the whole begins; text[at..) is the rest */
    size_t at = strchr(text, '\n') - text + 1;
    long nb = kvp_corpus_tokens(&g_model, "t", text, 0, at, 0, &b, err, sizeof err);
    cr_assert_gt(nb, 2);
    cr_assert_lt(nb, na);
    cr_assert_arr_eq(a, b, (size_t)nb * sizeof *b);
    free(b);
    b = NULL;
    long nr = kvp_corpus_tokens(&g_model, "t", text, at, strlen(text), 0, &b, err, sizeof err);
    cr_assert_gt(nr, 2);
    cr_assert_lt(nr, na);
    free(a);
    free(b);

    const char *conv = "{\"messages\":[{\"role\":\"user\",\"content\":\"Hi\"},"
                       "{\"role\":\"assistant\",\"content\":\"Hello there.\"}]}\n"
                       "\n"
                       "{\"messages\":[{\"role\":\"user\",\"content\":\"Bye\"}]}\n";
    int *c = NULL;
    long nc = kvp_corpus_tokens(&g_model, "c", conv, 0, strlen(conv), 1, &c, err, sizeof err);
    cr_assert_gt(nc, 4, "%s", err);
    free(c);
    static const struct {
        const char *text, *want;
    } bad[] = {
        {"{\"messages\":[]}\n", "c:1: no \"messages\" array"},
        {"\n\nnot json\n", "c:3:"},
        {"{\"messages\":[{\"role\":\"tool\",\"content\":\"x\"}]}", "c:1: a role other than"},
        {"{\"messages\":[{\"role\":\"user\"}]}", "c:1: a message without"},
        {"{\"messages\":[{\"role\":\"user\",\"content\":\"a\"},{\"role\":\"system\","
         "\"content\":\"s\"}]}", "c:1: a role other than"},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        c = NULL;
        cr_assert_eq(kvp_corpus_tokens(&g_model, "c", bad[i].text, 0, strlen(bad[i].text), 1,
                                       &c, err, sizeof err), -1, "%s", bad[i].text);
        cr_assert_null(c);
        cr_assert(strstr(err, bad[i].want), "wanted \"%s\" in \"%s\"", bad[i].want, err);
    }
}
