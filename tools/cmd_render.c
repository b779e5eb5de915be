/* `kvp render`: a conversation rendered by the model's own chat template
 * (tokenizer.chat_template, or --chat-template-file) with model/jinja.h, as transformers'
 * apply_chat_template renders it: messages (with tool_calls and tool messages), tools,
 * add_generation_prompt, bos_token / eos_token (the model's), enable_thinking when given.
 * Prints the prompt's bytes as they are. */
#include <errno.h>
#include <fcntl.h>
#include <getopt.h>
#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"
#include "model/gguf.h"
#include "model/jinja.h"
#include "model/jinja_json.h"
#include "model/tokenizer.h"
#include "tools/cli.h"

#define MAX_INPUT (64u << 20)

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp render (--model PATH | --chat-template-file F) --messages FILE\n"
        "                  [--tools FILE] [--add-generation-prompt] [--enable-thinking B]\n"
        "                  [--bos-token S] [--eos-token S]\n"
        "  --model PATH              GGUF: its tokenizer.chat_template, BOS and EOS pieces\n"
        "  --chat-template-file F    the Jinja template is F's text (instead of the GGUF's)\n"
        "  --messages FILE           JSON: an array of messages, or {\"messages\": [...]}\n"
        "  --tools FILE              JSON array of tool definitions (OpenAI's shape)\n"
        "  --add-generation-prompt   end with the opening of the assistant's reply\n"
        "  --enable-thinking B       pass enable_thinking = true|false to the template\n"
        "  --bos-token S, --eos-token S   override the model's pieces\n"
        "Prints the rendered prompt (no newline added).\n");
}

/* A whole regular file, NUL-terminated (malloc'd); NULL with a message on stderr. */
static char *slurp(const char *path, size_t *len)
{
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd < 0) {
        fprintf(stderr, "kvp render: %s: %s\n", path,
                fd == KVP_E_NOT_REGULAR ? "not a regular file" : strerror(-fd));
        return NULL;
    }
    if ((unsigned long long)st.st_size > MAX_INPUT) {
        fprintf(stderr, "kvp render: %s: larger than %u MiB\n", path, MAX_INPUT >> 20);
        close(fd);
        return NULL;
    }
    char *b = malloc((size_t)st.st_size + 1);
    long long n = b ? kvp_read_full(fd, b, (size_t)st.st_size) : -ENOMEM;
    close(fd);
    if (n < 0) {
        fprintf(stderr, "kvp render: %s: %s\n", path, strerror((int)-n));
        free(b);
        return NULL;
    }
    b[n] = 0;
    *len = (size_t)n;
    return b;
}

static json_t *load_json(const char *path)
{
    size_t len;
    char *s = slurp(path, &len);
    if (!s)
        return NULL;
    json_error_t je;
    json_t *j = json_loadb(s, len, JSON_ALLOW_NUL, &je);
    free(s);
    if (!j)
        fprintf(stderr, "kvp render: %s: bad JSON at line %d: %s\n", path, je.line, je.text);
    return j;
}

/* The piece of a special token id, "" when none. */
static char *piece_of(const kvp_tokenizer *t, int id)
{
    size_t n = 0;
    const char *p = id >= 0 ? kvp_tokenizer_piece(t, -1, id, &n) : NULL;
    return strndup(p ? p : "", p ? n : 0);
}

int kvp_cmd_render(int argc, char **argv)
{
    const char *model = NULL, *tfile = NULL, *mfile = NULL, *tools_file = NULL;
    const char *bos_o = NULL, *eos_o = NULL, *think = NULL;
    int gen = 0;
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"chat-template-file", 1, 0, 'c'}, {"messages", 1, 0, 'j'},
        {"tools", 1, 0, 't'}, {"add-generation-prompt", 0, 0, 'g'},
        {"enable-thinking", 1, 0, 'e'}, {"bos-token", 1, 0, 'b'}, {"eos-token", 1, 0, 'o'},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, NULL)) != -1) {
        switch (o) {
        case 'm': model = optarg; break;
        case 'c': tfile = optarg; break;
        case 'j': mfile = optarg; break;
        case 't': tools_file = optarg; break;
        case 'g': gen = 1; break;
        case 'e': think = optarg; break;
        case 'b': bos_o = optarg; break;
        case 'o': eos_o = optarg; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
    }
    if (optind < argc || (!model && !tfile) || !mfile) {
        fprintf(stderr, "kvp render: needs --messages and --model or --chat-template-file\n");
        usage(stderr);
        return 2;
    }
    if (think && strcmp(think, "true") && strcmp(think, "false")) {
        fprintf(stderr, "kvp render: --enable-thinking takes true or false, not '%s'\n", think);
        return 2;
    }
    int status = 1;
    char err[512], *tmpl = NULL, *bos = NULL, *eos = NULL, *out = NULL;
    size_t tlen = 0;
    json_t *msgs = NULL, *tools = NULL;
    kvp_jinja *t = NULL;
    kvp_jarena *a = NULL;
    if (model) {
        kvp_gguf g;
        kvp_tokenizer tok;
        memset(&tok, 0, sizeof tok);
        if (kvp_gguf_open(&g, model, err, sizeof err) ||
            (kvp_tokenizer_load_gguf(&tok, &g, err, sizeof err) && (kvp_gguf_close(&g), 1))) {
            fprintf(stderr, "kvp render: %s: %s\n", model, err);
            return 1;
        }
        const kvp_gguf_kv *kv = kvp_gguf_find(&g, "tokenizer.chat_template");
        if (!tfile && kv && kv->type == KVP_GGUF_STRING) {
            tmpl = strndup(kv->val.str.ptr, (size_t)kv->val.str.len);
            tlen = tmpl ? strlen(tmpl) : 0;
        }
        bos = piece_of(&tok, tok.bos_id);
        eos = piece_of(&tok, tok.eos_id);
        kvp_tokenizer_free(&tok);
        kvp_gguf_close(&g);
        if (!tfile && !tmpl) {
            fprintf(stderr, "kvp render: %s has no tokenizer.chat_template "
                    "(give one with --chat-template-file)\n", model);
            goto out;
        }
    }
    if (tfile && !(tmpl = slurp(tfile, &tlen)))
        goto out;
    if (!(t = kvp_jinja_parse(tmpl, tlen, err, sizeof err))) {
        fprintf(stderr, "kvp render: chat template %s: %s\n", tfile ? tfile : "of the model", err);
        goto out;
    }
    if (!(msgs = load_json(mfile)) || (tools_file && !(tools = load_json(tools_file))))
        goto out;
    json_t *list = json_is_object(msgs) ? json_object_get(msgs, "messages") : msgs;
    if (!json_is_array(list)) {
        fprintf(stderr, "kvp render: %s: expected an array of messages or {\"messages\": [...]}\n",
                mfile);
        goto out;
    }
    if (tools && !json_is_array(tools)) {
        fprintf(stderr, "kvp render: %s: expected an array of tools\n", tools_file);
        goto out;
    }
    a = kvp_jarena_new(0);
    kvp_jv *vars = a ? kvp_jv_dict(a) : NULL;
    const char *b = bos_o ? bos_o : bos ? bos : "", *e = eos_o ? eos_o : eos ? eos : "";
    kvp_jv_set(a, vars, "messages", kvp_jv_from_json(a, list));
    if (tools)
        kvp_jv_set(a, vars, "tools", kvp_jv_from_json(a, tools));
    kvp_jv_set(a, vars, "add_generation_prompt", kvp_jv_bool(a, gen));
    kvp_jv_set(a, vars, "bos_token", kvp_jv_str_trusted(a, b, strlen(b)));
    kvp_jv_set(a, vars, "eos_token", kvp_jv_str_trusted(a, e, strlen(e)));
    if (think)
        kvp_jv_set(a, vars, "enable_thinking", kvp_jv_bool(a, think[0] == 't'));
    long n = kvp_jinja_render(t, a, vars, NULL, &out, NULL, err, sizeof err);
    if (n < 0) {
        fprintf(stderr, "kvp render: chat template: %s\n", err);
        goto out;
    }
    status = fwrite(out, 1, (size_t)n, stdout) != (size_t)n || fflush(stdout) ? 1 : 0;
out:
    free(out);
    kvp_jarena_free(a);
    kvp_jinja_free(t);
    json_decref(msgs);
    json_decref(tools);
    free(tmpl);
    free(bos);
    free(eos);
    return status;
}
