/* sessions/policy_conf.c: the policy new sessions take, on stories260K: the default (its
 * policy/weights file when there is one, streaming when there is none or it does not
 * load, each with a note saying so), a named policy (a file only for kvp), and refusals. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/model.h"
#include "sessions/hub.h"
#include "tests/model/testutil.h"

static kvp_model g_model;
static char g_weights[1024], g_model_path[1024];

static void load(void)
{
    char err[256];
    snprintf(g_model_path, sizeof g_model_path, "%s", tu_shared("models/stories260K.bin"));
    cr_assert_eq(kvp_model_load(&g_model, g_model_path, NULL, err, sizeof err), 0, "%s", err);
    const char *src = getenv("KVP_SOURCE");
    snprintf(g_weights, sizeof g_weights, "%s/policy/weights/stories260K.kvp", src ? src : ".");
}

static void unload(void)
{
    kvp_model_free(&g_model);
    tu_remove_tmp_files();
}

TestSuite(policy_conf, .init = load, .fini = unload);

typedef struct made {
    struct kvp_policy_conf *pc;
    char note[512], err[512];
    int rc;
} made;

static void make(made *m, const char *policy, const char *file, const char *dflt)
{
    memset(m, 0, sizeof *m);
    kvp_hub_policy_params p = {.policy = policy, .policy_file = file, .default_file = dflt,
                               .looked = "policy/weights/stories260K.kvp",
                               .model_path = g_model_path};
    m->rc = kvp_hub_policy_make(&p, &g_model, &m->pc, m->note, sizeof m->note, m->err,
                                sizeof m->err);
}

Test(policy_conf, the_default_is_the_models_weights_file)
{
    made m;
    make(&m, NULL, NULL, g_weights);
    cr_assert_eq(m.rc, 0, "%s", m.err);
    cr_assert_str_eq(kvp_hub_policy_name(m.pc), "kvp");
    cr_assert_str_eq(kvp_hub_policy_file(m.pc), g_weights);
    cr_assert(strstr(m.note, "(the default for this model)"), "%s", m.note);
    kvp_hub_policy_unref(m.pc);
}

Test(policy_conf, without_a_file_the_default_is_streaming)
{
    made m;
    make(&m, "", NULL, NULL);
    cr_assert_eq(m.rc, 0, "%s", m.err);
    cr_assert_str_eq(kvp_hub_policy_name(m.pc), "streaming");
    cr_assert_str_eq(kvp_hub_policy_file(m.pc), "");
    cr_assert(strstr(m.note, "there is no policy/weights/stories260K.kvp"), "%s", m.note);
    cr_assert(strstr(m.note, "kvp learn --model "), "%s", m.note);
    cr_assert(strstr(m.note, g_model_path), "%s", m.note);
    kvp_hub_policy_unref(m.pc);
}

/* A default file that does not load must not keep the daemon from starting. */
Test(policy_conf, a_default_file_that_does_not_load_falls_back_to_streaming)
{
    const char *broken = tu_write_tmp("not a policy file", 17);
    made m;
    make(&m, NULL, NULL, broken);
    cr_assert_eq(m.rc, 0, "%s", m.err);
    cr_assert_str_eq(kvp_hub_policy_name(m.pc), "streaming");
    cr_assert_str_eq(kvp_hub_policy_file(m.pc), "");
    cr_assert(strstr(m.note, "does not load"), "%s", m.note);
    cr_assert(strstr(m.note, broken), "%s", m.note);
    kvp_hub_policy_unref(m.pc);
}

Test(policy_conf, a_named_policy)
{
    made m;
    make(&m, "h2o", g_weights, g_weights);
    cr_assert_eq(m.rc, 0, "%s", m.err);
    cr_assert_str_eq(kvp_hub_policy_name(m.pc), "h2o");
    cr_assert_str_eq(kvp_hub_policy_file(m.pc), "", "only kvp reads a file");
    cr_assert_str_eq(m.note, "policy h2o");
    kvp_hub_policy_unref(m.pc);
    make(&m, "kvp", g_weights, NULL);
    cr_assert_eq(m.rc, 0, "%s", m.err);
    cr_assert_str_eq(kvp_hub_policy_file(m.pc), g_weights);
    cr_assert(strstr(m.note, "policy kvp with "), "%s", m.note);
    kvp_hub_policy_unref(m.pc);
}

/* A named policy that cannot be had is an error, not a fallback. */
Test(policy_conf, refusals)
{
    made m;
    const char *broken = tu_write_tmp("not a policy file", 17);
    make(&m, "kvp", broken, NULL);
    cr_assert_lt(m.rc, 0, "a broken kvp file was taken");
    cr_assert_null(m.pc);
    cr_assert(m.err[0]);
    make(&m, "no-such-policy", NULL, NULL);
    cr_assert_lt(m.rc, 0, "an unknown policy was taken");
    cr_assert_null(m.pc);
    cr_assert(m.err[0]);
    cr_assert_str_eq(kvp_hub_policy_name(NULL), "");
    cr_assert_str_eq(kvp_hub_policy_file(NULL), "");
}
