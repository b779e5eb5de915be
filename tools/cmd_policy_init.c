/* kvp policy-init: writes a randomly initialised KVP policy file for a model's shape
 * (the starting point for training; docs/policy-format.md describes the file). */
#include <errno.h>
#include <limits.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "policy/kvp_agent.h"
#include "offline/agent_train.h"
#include "base/parse.h"
#include "tools/cli.h"
#include "tools/stages.h"

static void usage(FILE *f)
{
    fprintf(f,
            "usage: kvp policy-init --model M --out F [options]\n"
            "Writes a randomly initialised KVP policy (one agent per layer x KV head).\n"
            "  --model M       GGUF or llama2.c checkpoint (only its shape is used)\n"
            "  --tokenizer T   tokenizer of a llama2.c checkpoint (default: beside it)\n"
            "  --out F         policy file to write\n"
            "  --seed S        initialisation seed (default 1)\n"
            "  --width P       key/value projection width (default %d)\n"
            "  --hidden H      hidden width (default %d)\n"
            "  --pos-dim E     position embedding width (default %d)\n"
            "  --pos-max N     position table size; later positions share its last row "
            "(default %d)\n"
            "  --keys K        relative: the agents see each key minus the mean key of the\n"
            "                  head's cached rows, turned back by the decision's position\n"
            "                  with the model's RoPE (default); centred: not turned back;\n"
            "                  raw: the key itself\n",
            KVP_AGENT_DEFAULT_P, KVP_AGENT_DEFAULT_H, KVP_AGENT_DEFAULT_E,
            KVP_AGENT_DEFAULT_PMAX);
}

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvp policy-init: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(kvp policy-init --help for usage)\n");
    va_end(ap);
    return 2;
}

void kvp_policy_init_defaults(kvp_policy_init_opts *o)
{
    *o = (kvp_policy_init_opts){
        .seed = 1,
        .arch = {.d = 1, .P = KVP_AGENT_DEFAULT_P, .E = KVP_AGENT_DEFAULT_E,
                 .H = KVP_AGENT_DEFAULT_H, .pmax = KVP_AGENT_DEFAULT_PMAX, .centered = 1,
                 .relative = 1}};
}

int kvp_cmd_policy_init(int argc, char **argv)
{
    kvp_policy_init_opts po;
    kvp_policy_init_defaults(&po);
    kvp_agent_arch *a = &po.arch;
    const struct { const char *flag; int *dst; } int_flags[] = {
        {"--width", &a->P}, {"--hidden", &a->H}, {"--pos-dim", &a->E},
        {"--pos-max", &a->pmax},
    };

    for (int i = 1; i < argc; i++) {
        const char *o = argv[i];
        if (!strcmp(o, "--help") || !strcmp(o, "-h")) {
            usage(stdout);
            return 0;
        }
        if (strncmp(o, "--", 2) != 0)
            return usage_error("unexpected argument '%s'", o);
        if (i + 1 >= argc)
            return usage_error("%s needs a value", o);
        const char *val = argv[++i];
        size_t f;
        for (f = 0; f < sizeof int_flags / sizeof int_flags[0]; f++)
            if (!strcmp(o, int_flags[f].flag))
                break;
        if (f < sizeof int_flags / sizeof int_flags[0]) {
            long v;
            if (!kvp_parse_long(val, 1, INT_MAX, &v))
                return usage_error("%s needs a positive integer, got '%s'", o, val);
            *int_flags[f].dst = (int)v;
        } else if (!strcmp(o, "--model")) {
            po.model = val;
        } else if (!strcmp(o, "--tokenizer")) {
            po.tokenizer = val;
        } else if (!strcmp(o, "--out")) {
            po.out = val;
        } else if (!strcmp(o, "--keys")) {
            if (strcmp(val, "relative") && strcmp(val, "centred") && strcmp(val, "raw"))
                return usage_error("--keys is relative, centred or raw, got '%s'", val);
            a->centered = strcmp(val, "raw") != 0;
            a->relative = !strcmp(val, "relative");
        } else if (!strcmp(o, "--seed")) {
            long v;
            if (!kvp_parse_long(val, 0, LONG_MAX, &v))
                return usage_error("%s needs an unsigned integer, got '%s'", o, val);
            po.seed = (uint64_t)v;
        } else {
            return usage_error("unknown option '%s'", o);
        }
    }
    if (!po.model)
        return usage_error("--model is required");
    if (!po.out)
        return usage_error("--out is required");
    return kvp_policy_init_run(&po);
}

int kvp_policy_init_run(const kvp_policy_init_opts *po)
{
    const char *model_path = po->model, *tok_path = po->tokenizer, *out = po->out;
    uint64_t seed = po->seed;
    kvp_agent_arch arch = po->arch;
    char err[512];
    /* Size limits are a usage matter; head_dim (from the model) is checked again below. */
    if (kvp_agent_arch_check(&arch, err, sizeof err))
        return usage_error("%s", err);

    kvp_model m;
    if (kvp_model_load(&m, model_path, tok_path, err, sizeof err)) {
        fprintf(stderr, "kvp policy-init: cannot load model %s: %s\n", model_path, err);
        return 1;
    }
    kvp_model_config cfg = m.cfg;
    char name[KVP_POLICY_MODEL_NAME];
    snprintf(name, sizeof name, "%.63s", m.name);

    arch.d = cfg.head_dim;
    kvp_agent_set s;
    if (kvp_agent_set_alloc(&s, cfg.n_layers, cfg.n_kv_heads, &arch, err, sizeof err)) {
        fprintf(stderr, "kvp policy-init: %s\n", err);
        kvp_model_free(&m);
        return 1;
    }
    /* the set keeps its own copy of the model's rotation (and its factors) */
    int bad_rope = arch.relative && kvp_agent_set_rope(&s, &cfg.rope, err, sizeof err);
    kvp_model_free(&m);
    if (bad_rope) {
        fprintf(stderr, "kvp policy-init: --keys relative: %s\n", err);
        kvp_agent_set_free(&s);
        return 1;
    }
    kvp_agent_set_init(&s, seed);
    s.model_fingerprint = cfg.fingerprint;   /* the trained file stays bound to this model */
    memcpy(s.model_name, name, sizeof name);
    int rc = kvp_agent_set_save(&s, out, err, sizeof err);
    if (rc) {
        fprintf(stderr, "kvp policy-init: %s\n", err);
    } else {
        printf("wrote %s: %d layers x %d KV heads x head_dim %d, P %d E %d H %d pmax %d, "
               "%s keys, %zu parameters per agent, seed %llu, for model '%s' (weights %016llx)\n",
               out, s.n_layers, s.n_kv_heads, arch.d, arch.P, arch.E, arch.H, arch.pmax,
               arch.relative ? "relative" : arch.centered ? "centred" : "raw",
               s.n_params, (unsigned long long)seed, s.model_name,
               (unsigned long long)s.model_fingerprint);
        if (cfg.seq_len > arch.pmax)
            fprintf(stderr, "kvp policy-init: note: the model's context is %d; positions "
                    ">= %d share one embedding row\n", cfg.seq_len, arch.pmax);
    }
    kvp_agent_set_free(&s);
    return rc ? 1 : 0;
}
