/* `kvp tokenize`: the token ids of a text, as the daemon encodes a user's message (no
 * BOS, no special tokens from text: "<|im_start|>" in the text is plain text). */
#include <errno.h>
#include <limits.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/gguf.h"
#include "model/model.h"
#include "model/tokenizer.h"
#include "tools/cli.h"

#define MAX_TEXT (256u << 20)   /* refuse to slurp more than this */

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp tokenize --model PATH (--text T | --file F) [--pieces] [--tokenizer PATH]\n"
        "  --model PATH       GGUF (only its tokenizer is read) or llama2.c checkpoint\n"
        "  --tokenizer PATH   tokenizer.bin for llama2.c checkpoints\n"
        "  --text T           the text\n"
        "  --file F           the text is F's bytes, as they are (any bytes)\n"
        "  --pieces           one token a line: id, a tab, its bytes (C-escaped)\n"
        "Prints the ids on one line, space-separated.\n");
}

/* Reads a whole file into *buf (malloc'd). */
static int read_file(const char *path, char **buf, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "kvp tokenize: %s: %s\n", path, strerror(errno));
        return -1;
    }
    size_t cap = 1 << 16, n = 0;
    char *b = malloc(cap);
    for (size_t r; b && (r = fread(b + n, 1, cap - n, f)) > 0;) {
        n += r;
        if (n == cap) {
            char *nb = cap < MAX_TEXT ? realloc(b, cap * 2) : NULL;
            if (!nb) {
                fprintf(stderr, "kvp tokenize: %s: larger than %u MiB or out of memory\n",
                        path, MAX_TEXT >> 20);
                free(b);
                fclose(f);
                return -1;
            }
            b = nb;
            cap *= 2;
        }
    }
    int bad = ferror(f) || !b;
    fclose(f);
    if (bad) {
        fprintf(stderr, "kvp tokenize: %s: read error\n", path);
        free(b);
        return -1;
    }
    *buf = b;
    *len = n;
    return 0;
}

/* A piece with its control and non-ASCII-printable bytes C-escaped (UTF-8 stays). */
static void print_piece(const char *p, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)p[i];
        if (c == '\\')
            fputs("\\\\", stdout);
        else if (c == '\n')
            fputs("\\n", stdout);
        else if (c == '\t')
            fputs("\\t", stdout);
        else if (c < 0x20 || c == 0x7F)
            printf("\\x%02x", c);
        else
            putchar(c);
    }
}

int kvp_cmd_tokenize(int argc, char **argv)
{
    const char *model_path = NULL, *tok_path = NULL, *text = NULL, *file = NULL;
    int pieces = 0;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'z'}, {"text", 1, 0, 't'},
        {"file", 1, 0, 'f'}, {"pieces", 0, 0, 'p'}, {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model_path = optarg; break;
        case 'z': tok_path = optarg; break;
        case 't': text = optarg; break;
        case 'f': file = optarg; break;
        case 'p': pieces = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || !model_path || !text == !file) {
        fprintf(stderr, "kvp tokenize: needs --model and one of --text or --file\n");
        usage(stderr);
        return 2;
    }

    char err[512];
    kvp_model m;
    memset(&m, 0, sizeof m);
    kvp_tokenizer *t = &m.tok;
    int is_gguf = 0;
    FILE *f = fopen(model_path, "rb");
    if (f) {
        char magic[4];
        is_gguf = fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
        fclose(f);
    }
    int rc;
    if (is_gguf) {
        /* Only the tokenizer: a large model's weights are never read. */
        kvp_gguf g;
        if ((rc = kvp_gguf_open(&g, model_path, err, sizeof err)) == 0) {
            rc = kvp_tokenizer_load_gguf(t, &g, err, sizeof err);
            kvp_gguf_close(&g);
        }
    } else {
        rc = kvp_model_load(&m, model_path, tok_path, err, sizeof err);
    }
    if (rc) {
        fprintf(stderr, "kvp tokenize: %s: %s\n", model_path, err);
        return 1;
    }

    char *buf = NULL;
    size_t len = 0;
    int *ids = NULL, n = -ENOMEM, status = 1;
    if (file && read_file(file, &buf, &len))
        goto out;
    if (text) {
        buf = strdup(text);
        len = strlen(text);
    }
    /* A token covers at least one byte; +1 for the dummy prefix. Only NFC (Qwen) can
     * lengthen text, up to 4x: then once more with room for that. */
    for (size_t cap = len + 2; buf && n == -ENOMEM && cap <= 4 * len + 2; cap = 4 * len + 2) {
        free(ids);
        if (cap > (size_t)INT_MAX || !(ids = malloc(cap * sizeof *ids)))
            break;
        n = kvp_tokenizer_encode(t, buf, len, 0, ids, (int)cap);
        if (n == -ENOSPC && cap < 4 * len + 2)
            n = -ENOMEM;   /* retry */
    }
    if (n < 0) {
        fprintf(stderr, "kvp tokenize: cannot encode %zu bytes: %s\n", len, strerror(-n));
        goto out;
    }
    for (int i = 0; i < n; i++) {
        if (pieces) {
            size_t pl;
            const char *p = kvp_tokenizer_piece(t, i ? ids[i - 1] : -1, ids[i], &pl);
            printf("%d\t", ids[i]);
            print_piece(p, pl);
            putchar('\n');
        } else {
            printf(i ? " %d" : "%d", ids[i]);
        }
    }
    if (!pieces)
        putchar('\n');
    status = fflush(stdout) ? 1 : 0;
out:
    free(buf);
    free(ids);
    if (is_gguf)
        kvp_tokenizer_free(t);
    else
        kvp_model_free(&m);
    return status;
}
