/* Token streams for the offline tools (see corpus.h). */
#include "tools/corpus.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/template.h"
#include "offline/trace.h"

char *kvp_corpus_read(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    char *buf = NULL;
    long n;
    if (!f)
        return NULL;
    if (!fseek(f, 0, SEEK_END) && (n = ftell(f)) >= 0 && !fseek(f, 0, SEEK_SET) &&
        (buf = malloc((size_t)n + 1)) && fread(buf, 1, (size_t)n, f) == (size_t)n) {
        buf[n] = '\0';
        *len = (size_t)n;
    } else {
        free(buf);
        buf = NULL;
    }
    fclose(f);
    return buf;
}

/* The conversations of JSON lines text[0..len) rendered one after the other with the
 * model's chat template, as the daemon would have them in its cache. *out is malloc'd;
 * returns the token count, or -1 with a message naming the line. */
static long render_conversations(const kvp_template *t, const char *path, const char *text,
                                 size_t len, long first_line, int **out, char *err, size_t errlen)
{
    long n = 0, cap = 0, line = first_line;
    int *ids = NULL;
    for (size_t off = 0; off < len; line++) {
        const char *nl = memchr(text + off, '\n', len - off);
        size_t end = nl ? (size_t)(nl - text) : len;
        const char *at = text + off;
        size_t llen = end - off;
        off = end + 1;
        while (llen && (at[llen - 1] == '\r' || at[llen - 1] == ' '))
            llen--;
        if (!llen)
            continue;
        json_error_t je;
        json_t *j = json_loadb(at, llen, 0, &je);
        json_t *msgs = json_is_object(j) ? json_object_get(j, "messages") : NULL;
        size_t nm = json_is_array(msgs) ? json_array_size(msgs) : 0;
        kvp_chat_msg *cm = calloc(nm ? nm : 1, sizeof *cm);
        const char *system = NULL, *bad = !j ? je.text : !nm ? "no \"messages\" array" : NULL;
        size_t system_len = 0;
        int nc = 0;
        for (size_t i = 0; !bad && cm && i < nm; i++) {
            json_t *m = json_array_get(msgs, i), *c = json_object_get(m, "content");
            const char *role = json_string_value(json_object_get(m, "role"));
            if (!role || !json_is_string(c))
                bad = "a message without a string role and content";
            else if (!strcmp(role, "system") && i == 0) {
                system = json_string_value(c);
                system_len = json_string_length(c);
            } else if (!strcmp(role, "user") || !strcmp(role, "assistant"))
                cm[nc++] = (kvp_chat_msg){!strcmp(role, "user"), json_string_value(c),
                                          json_string_length(c)};
            else
                bad = "a role other than system (first), user or assistant";
        }
        int *tok = NULL;
        long k = bad || !cm ? -1 : kvp_template_render(t, system, system_len, cm, nc, &tok);
        if (k >= 0 && n + k > cap) {
            long want = cap ? cap : 4096;
            while (want < n + k)
                want *= 2;
            int *grown = realloc(ids, (size_t)want * sizeof *ids);
            if (grown) {
                ids = grown;
                cap = want;
            } else {
                k = -1;
                bad = "out of memory";
            }
        }
        if (k >= 0) {
            memcpy(ids + n, tok, (size_t)k * sizeof *ids);
            n += k;
        }
        free(tok);
        free(cm);
        json_decref(j);
        if (k < 0) {
            snprintf(err, errlen, "%s:%ld: %s", path, line, bad ? bad : "cannot render it");
            free(ids);
            return -1;
        }
    }
    *out = ids;
    return n;
}

/* Lines of decimal token ids (KVP_CORPUS_IDS). */
static long read_ids(const kvp_model *m, const char *path, const char *text, size_t from,
                     size_t to, int **out, char *err, size_t errlen)
{
    long n = 0, cap = 1024, line = 1;
    int *ids = malloc((size_t)cap * sizeof *ids);
    if (!ids) {
        snprintf(err, errlen, "out of memory");
        return -1;
    }
    for (size_t i = 0; i < from; i++)
        line += text[i] == '\n';
    size_t i = from;
    while (i < to) {
        char c = text[i];
        if (c == '\n' || c == ' ' || c == '\r' || c == '\t') {
            line += c == '\n';
            i++;
            continue;
        }
        long v = 0;
        size_t start = i;
        while (i < to && text[i] >= '0' && text[i] <= '9' && v < (1L << 31))
            v = v * 10 + (text[i++] - '0');
        if (i == start || v >= m->cfg.vocab_size ||
            (i < to && text[i] != ' ' && text[i] != '\n' && text[i] != '\r' && text[i] != '\t')) {
            snprintf(err, errlen, "%s:%ld: not a token id of this model's vocabulary (0..%d)",
                     path, line, m->cfg.vocab_size - 1);
            free(ids);
            return -1;
        }
        if (n == cap) {
            int *v2 = realloc(ids, (size_t)(cap *= 2) * sizeof *ids);
            if (!v2) {
                free(ids);
                snprintf(err, errlen, "out of memory");
                return -1;
            }
            ids = v2;
        }
        ids[n++] = (int)v;
    }
    *out = ids;
    return n;
}

long kvp_corpus_tokens(const kvp_model *m, const char *path, const char *text, size_t from,
                       size_t to, int conversations, int **out, char *err, size_t errlen)
{
    if (conversations == KVP_CORPUS_IDS)
        return read_ids(m, path, text, from, to, out, err, errlen);
    if (!conversations) {
        long n = kvp_trace_tokenize(&m->tok, text + from, to - from, out);
        if (n < 0)
            snprintf(err, errlen, "cannot tokenize %s", path);
        return n;
    }
    kvp_template t;
    char note[256];
    if (kvp_template_init(&t, m, NULL, note, sizeof note) < 0) {
        snprintf(err, errlen, "%s", note);
        return -1;
    }
    long line = 1;
    for (size_t i = 0; i < from; i++)
        line += text[i] == '\n';
    long n = render_conversations(&t, path, text + from, to - from, line, out, err, errlen);
    kvp_template_free(&t);
    return n;
}

const char *kvp_corpus_format(const kvp_model *m)
{
    kvp_template t;
    char note[256];
    if (kvp_template_init(&t, m, NULL, note, sizeof note) < 0)
        return "none";
    kvp_template_free(&t);   /* the format's name is static */
    return kvp_template_name(t.format);
}

long kvp_corpus_count(long n_ids, long len, int bos)
{
    return n_ids / (bos >= 0 ? len - 1 : len);
}

void kvp_corpus_sequence(const int *ids, long i, long len, int bos, int *out)
{
    long body = bos >= 0 ? len - 1 : len;
    if (bos >= 0)
        *out++ = bos;
    memcpy(out, ids + i * body, (size_t)body * sizeof *out);
}
