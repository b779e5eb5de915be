/* kvp policy-init (tools/cmd_policy_init.c). */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offline/agent_train.h"
#include "policy/kvp_agent.h"
#include "policy/policy.h"
#include "tests/model/testutil.h"
#include "tests/policy/agentutil.h"

static int run_init(const char *args, char **out)
{
    char cmd[4096];
    snprintf(cmd, sizeof cmd, "%s policy-init %s 2>&1", tu_build("tools/kvp"), args);
    return tu_run(cmd, out);
}

Test(policy_init, policy_init_writes_a_loadable_deterministic_file)
{
    const char *p1 = tmp_path(), *p2 = tmp_path(), *p3 = tmp_path();
    char args[2048], *out;
    char model[1024];   /* tu_shared's buffers rotate: keep a copy */
    snprintf(model, sizeof model, "%s", tu_shared("models/stories260K.gguf"));
    snprintf(args, sizeof args, "--model %s --out %s --seed 9", model, p1);
    cr_assert_eq(run_init(args, &out), 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "--model %s --out %s --seed 9", model, p2);
    cr_assert_eq(run_init(args, &out), 0, "%s", out);
    free(out);
    snprintf(args, sizeof args, "--model %s --out %s --seed 10 --width 16 --hidden 24 "
             "--pos-dim 8 --pos-max 128 --keys raw", model, p3);
    cr_assert_eq(run_init(args, &out), 0, "%s", out);
    free(out);

    size_t n1, n2;
    char *b1 = tu_slurp(p1, &n1), *b2 = tu_slurp(p2, &n2);
    cr_assert_eq(n1, n2);
    cr_assert_eq(memcmp(b1, b2, n1), 0);
    free(b1);
    free(b2);

    kvp_model_config cfg = {.n_layers = 5, .n_kv_heads = 4, .head_dim = 8};
    kvp_agent_set s;
    char err[512];
    cr_assert_eq(kvp_agent_set_load(&s, p1, &cfg, err, sizeof err), 0, "%s", err);
    kvp_agent_arch relative = default_arch;   /* the default: relative keys, version 4 */
    relative.centered = 1;
    relative.relative = 1;
    cr_assert_eq(memcmp(&s.arch, &relative, sizeof s.arch), 0);
    /* with the model's own rotation: stories260K is a llama2.c model, consecutive pairs */
    kvp_model m;
    cr_assert_eq(kvp_model_load(&m, model, NULL, err, sizeof err), 0, "%s", err);
    cr_assert(kvp_rope_same(&s.rope, &m.cfg.rope));
    cr_assert_eq(s.rope.n_rot, 8);
    kvp_model_free(&m);
    kvp_agent_set_free(&s);
    cr_assert_eq(kvp_agent_set_load(&s, p3, &cfg, err, sizeof err), 0, "%s", err);
    kvp_agent_arch want = {.d = 8, .P = 16, .E = 8, .H = 24, .pmax = 128};
    cr_assert_eq(memcmp(&s.arch, &want, sizeof want), 0);
    kvp_agent_set_free(&s);
    unlink(p1);
    unlink(p2);
    unlink(p3);
}

Test(policy_init, policy_init_usage_and_runtime_errors)
{
    char args[2048], *out;
    char model[1024];   /* tu_shared's buffers rotate: keep a copy */
    snprintf(model, sizeof model, "%s", tu_shared("models/stories260K.gguf"));
    const char *usage[] = {
        "",
        "--out /tmp/x.kvp",
        "--model m.gguf",
        "--model m.gguf --out /tmp/x.kvp --width 0",
        "--model m.gguf --out /tmp/x.kvp --hidden 12abc",
        "--model m.gguf --out /tmp/x.kvp --pos-max 99999999999",
        "--model m.gguf --out /tmp/x.kvp --keys sideways",
        "--model m.gguf --out /tmp/x.kvp --seed -1",
        "--model m.gguf --out /tmp/x.kvp --bogus",
        "--model m.gguf --out",
    };
    for (size_t i = 0; i < sizeof usage / sizeof usage[0]; i++) {
        cr_assert_eq(run_init(usage[i], &out), 2, "'%s': %s", usage[i], out);
        cr_assert_neq(strlen(out), 0, "'%s' printed nothing", usage[i]);
        free(out);
    }
    cr_assert_eq(run_init("--help", &out), 0);
    cr_assert(strstr(out, "--pos-max"), "%s", out);
    free(out);

    cr_assert_eq(run_init("--model /nonexistent.gguf --out /tmp/never.kvp", &out), 1);
    cr_assert(strstr(out, "/nonexistent.gguf"), "%s", out);
    free(out);
    snprintf(args, sizeof args, "--model %s --out /nonexistent-dir/x.kvp", model);
    cr_assert_eq(run_init(args, &out), 1);
    cr_assert(strstr(out, "/nonexistent-dir/x.kvp"), "%s", out);
    free(out);
}
