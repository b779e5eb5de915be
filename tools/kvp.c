/* kvp: the offline CLI; `commands` below lists its subcommands (`kvp` alone prints them). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/stages.h"

static const struct {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *help;
} commands[] = {
    {"generate", kvp_cmd_generate, "generate text from a model (optionally with eviction)"},
    {"synth", kvp_cmd_synth, "write a random-weight llama GGUF of a given shape"},
    {"quantize", kvp_cmd_quantize, "rewrite a GGUF model with quantized matrices (q8_0 ... q4_K_M)"},
    {"policy-init", kvp_cmd_policy_init, "write a randomly initialised KVP policy file"},
    {"trace", kvp_cmd_trace, "record q/k/v traces of a model over text, for training"},
    {"eval", kvp_cmd_eval, "evaluate eviction policies on held-out text (ranking, one-shot, streaming)"},
    {"forkeval", kvp_cmd_forkeval, "measure forked caches (the source cut at the divergence) against fresh prefills"},
    {"plot", kvp_cmd_plot, "an SVG line plot of measured points from a CSV (series at their own x)"},
    {"train", kvp_cmd_train, "train KVP agents on traces (policy file + curve CSV)"},
    {"calibrate", kvp_cmd_calibrate, "fit a KVP policy's per-head score calibration on traces (global budgets)"},
    {"fit-window", kvp_cmd_fit_window, "fit how many older rows each layer's KVP agents choose, by one-shot KL"},
    {"learn", kvp_cmd_learn, "trace, train, evaluate and install a KVP policy for a model, in one go"},
    {"logits", kvp_cmd_logits, "write the logits of every position of a token sequence (f32)"},
    {"tokenize", kvp_cmd_tokenize, "print the token ids of a text (as the daemon encodes a message)"},
    {"render", kvp_cmd_render, "print a conversation rendered by the model's own Jinja chat template"},
};

int kvp_stage_threads(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)(n < 1024 ? n : 1024) : 1;
}

static void usage(FILE *f)
{
    fprintf(f, "usage: kvp <command> [options]   (kvp <command> --help for its options)\n\n");
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        fprintf(f, "  %-12s %s\n", commands[i].name, commands[i].help);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "--help") || !strcmp(argv[1], "-h")) {
        usage(stdout);
        return 0;
    }
    if (!strcmp(argv[1], "--version")) {
        printf("kvp %s\n", KVP_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (!strcmp(argv[1], commands[i].name))
            return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "kvp: unknown command '%s'\n", argv[1]);
    usage(stderr);
    return 2;
}
