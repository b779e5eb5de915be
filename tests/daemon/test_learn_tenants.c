/* learn_dir per tenant: each API key's transcripts are kept in a folder of its own
 * (learn_dir/<tenant id>, learn_dir/default without keys); DELETE /v1/learn/transcripts
 * deletes the caller's own and nobody else's, DELETE /admin/learn/transcripts/TENANT
 * (admin_token) a named tenant's; bad requests get clear errors; learn_exclude_system
 * leaves the system prompt's tokens out of the files; kvp learn --transcripts reads the
 * whole learn_dir or one tenant's folder. */
#include <criterion/criterion.h>
#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/clock.h"
#include "base/tokfile.h"
#include "tests/daemon/harness.h"

TestSuite(learn_tenants, .timeout = 120);

#define KA "Authorization: Bearer key-a\r\n"
#define KB "Authorization: Bearer key-b\r\n"

/* A key's tenant id: the name of its folder. */
static void tenant_of(const char *key, char out[17])
{
    snprintf(out, 17, "%016llx",
             (unsigned long long)kvp_fnv1a(KVP_FNV1A_INIT, key, strlen(key)));
}

/* Removes dir with its tenant folders. */
static void rm_tree(const char *dir)
{
    DIR *d = opendir(dir);
    char p[512];
    for (struct dirent *e; d && (e = readdir(d));)
        if (strcmp(e->d_name, ".") && strcmp(e->d_name, "..")) {
            snprintf(p, sizeof p, "%s/%s", dir, e->d_name);
            if (unlink(p))
                h_rmdir(p);
        }
    if (d)
        closedir(d);
    rmdir(dir);
}

static void folder(const char *learn, const char *tenant, char *out, size_t n)
{
    snprintf(out, n, "%s/%s", learn, tenant);
}

/* Waits until the folder holds want transcripts (they are written in the background). */
static void wait_files(const char *dir, int want)
{
    double end = kvp_now() + 30;
    while (h_count_files(dir, ".kvtx") < want) {
        cr_assert_lt(kvp_now(), end, "%s holds %d transcripts, not %d", dir, h_count_files(dir, ".kvtx"),
                     want);
        usleep(20 * 1000);
    }
    cr_assert_eq(h_count_files(dir, ".kvtx"), want, "%s", dir);
}

/* One conversation of one turn; its session id into sid when not NULL. */
static void converse(const kvpd_proc *d, const char *headers, const char *body, char *sid)
{
    char *raw = NULL;
    const char *rb = NULL;
    int st = h_request(d->port, "POST", "/v1/chat/completions", headers, body, &raw, &rb);
    cr_assert_eq(st, 200, "%s", raw);
    if (sid)
        snprintf(sid, 64, "%s", h_header(raw, "x-session-id:"));
    free(raw);
}

#define ONE_TURN(text) \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"" text "\"}],\"max_tokens\":4}"

/* A request's status; its JSON body into *out (may be NULL); raw into *raw_out when not
 * NULL. */
static int call(const kvpd_proc *d, const char *method, const char *path, const char *headers,
                json_t **out, char **raw_out)
{
    char *raw = NULL;
    const char *rb = NULL;
    int st = h_request(d->port, method, path, headers, "", &raw, &rb);
    if (out)
        *out = rb ? json_loads(rb, JSON_DISABLE_EOF_CHECK, NULL) : NULL;
    if (raw_out)
        *raw_out = raw;
    else
        free(raw);
    return st;
}

static const char *err_code(json_t *j)
{
    return json_string_value(json_object_get(json_object_get(j, "error"), "code"));
}

static const char *err_msg(json_t *j)
{
    const char *m = json_string_value(json_object_get(json_object_get(j, "error"), "message"));
    return m ? m : "";
}

static void start(kvpd_proc *d, const char *learn, const char *more)
{
    char args[512];
    snprintf(args, sizeof args, "--learn-dir %s --learn-rate 1 --max-tokens 4 %s", learn, more);
    cr_assert_eq(kvpd_start(d, args), 0, "log %s", d->log);
}

/* A daemon with keys A and B keeping transcripts in a new learn (made here): A holds
 * a_convs conversations (1 or 2), B one, all written; ta/tb are the keys' tenant ids and
 * fa/fb their folders. */
static void start_two_keys(kvpd_proc *d, char learn[64], char ta[17], char tb[17],
                           char fa[128], char fb[128], int a_convs)
{
    cr_assert_eq(h_mkdtemp(learn, 64), 0);
    tenant_of("key-a", ta);
    tenant_of("key-b", tb);
    folder(learn, ta, fa, 128);
    folder(learn, tb, fb, 128);
    start(d, learn, "--api-key key-a,key-b");
    converse(d, KA, ONE_TURN("Once upon a time"), NULL);
    if (a_convs > 1)
        converse(d, KA, ONE_TURN("A frog sat on a log."), NULL);
    converse(d, KB, ONE_TURN("The sun was hot."), NULL);
    wait_files(fa, a_convs);
    wait_files(fb, 1);
}

Test(learn_tenants, each_key_has_its_folder_and_deletes_only_its_own)
{
    char learn[64], ta[17], tb[17], fa[128], fb[128];
    kvpd_proc d;
    start_two_keys(&d, learn, ta, tb, fa, fb, 2);
    cr_assert_eq(h_count_files(learn, ".kvtx"), 0, "a transcript outside the tenants' folders");
    struct stat st;
    cr_assert_eq(stat(fa, &st), 0);
    cr_assert_eq(st.st_mode & 0777, 0700);

    /* B deletes: its own only */
    json_t *j;
    cr_assert_eq(call(&d, "DELETE", "/v1/learn/transcripts", KB, &j, NULL), 200);
    cr_assert_str_eq(json_string_value(json_object_get(j, "tenant")), tb);
    cr_assert_eq(json_integer_value(json_object_get(j, "deleted")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(j, "object")), "learn.transcripts.deleted");
    json_decref(j);
    cr_assert_eq(h_count_files(fb, ".kvtx"), 0);
    cr_assert_eq(h_count_files(fa, ".kvtx"), 2, "B's deletion took A's transcripts");
    /* B's key is no admin token: the admin form naming A is refused */
    char path[128];
    snprintf(path, sizeof path, "/admin/learn/transcripts/%s", ta);
    cr_assert_eq(call(&d, "DELETE", path, KB, NULL, NULL), 401);
    cr_assert_eq(h_count_files(fa, ".kvtx"), 2, "a key deleted another tenant's transcripts");
    /* nor does a path without the admin token */
    cr_assert_eq(call(&d, "DELETE", "/v1/learn/transcripts", NULL, &j, NULL), 401);
    json_decref(j);
    cr_assert_eq(h_count_files(fa, ".kvtx"), 2);

    /* A deletes its own */
    cr_assert_eq(call(&d, "DELETE", "/v1/learn/transcripts", KA, &j, NULL), 200);
    cr_assert_eq(json_integer_value(json_object_get(j, "deleted")), 2);
    json_decref(j);
    cr_assert_neq(access(fa, F_OK), 0, "A's folder is left");
    /* again: nothing left, still 200 */
    cr_assert_eq(call(&d, "DELETE", "/v1/learn/transcripts", KA, &j, NULL), 200);
    cr_assert_eq(json_integer_value(json_object_get(j, "deleted")), 0);
    json_decref(j);
    /* A's next conversation is kept again */
    converse(&d, KA, ONE_TURN("Then it rained."), NULL);
    wait_files(fa, 1);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    rm_tree(learn);
}

Test(learn_tenants, the_admin_deletes_a_named_tenants_and_bad_requests_are_told_why)
{
    char learn[64], ta[17], tb[17], fa[128], fb[128], path[160];
    kvpd_proc d;
    start_two_keys(&d, learn, ta, tb, fa, fb, 1);
    char admin[256];
    snprintf(admin, sizeof admin, "Authorization: Bearer %s\r\n", h_admin_token(&d));
    json_t *j;
    char *raw = NULL;

    snprintf(path, sizeof path, "/admin/learn/transcripts/%s", ta);
    cr_assert_eq(call(&d, "DELETE", path, NULL, NULL, NULL), 401, "no admin token");
    cr_assert_eq(call(&d, "GET", path, admin, &j, &raw), 405);
    cr_assert(strstr(h_header(raw, "allow:"), "DELETE"), "%s", raw);
    cr_assert(strstr(err_msg(j), "DELETE"), "%s", raw);
    free(raw);
    json_decref(j);
    cr_assert_eq(h_count_files(fa, ".kvtx"), 1);

    cr_assert_eq(call(&d, "DELETE", path, admin, &j, NULL), 200);
    cr_assert_eq(json_integer_value(json_object_get(j, "deleted")), 1);
    cr_assert_str_eq(json_string_value(json_object_get(j, "tenant")), ta);
    json_decref(j);
    cr_assert_eq(h_count_files(fa, ".kvtx"), 0);
    cr_assert_eq(h_count_files(fb, ".kvtx"), 1, "the admin's deletion of A took B's");
    /* a known tenant with nothing kept: 0 deleted */
    cr_assert_eq(call(&d, "DELETE", path, admin, &j, NULL), 200);
    cr_assert_eq(json_integer_value(json_object_get(j, "deleted")), 0);
    json_decref(j);

    /* an id no key has, with nothing kept */
    cr_assert_eq(call(&d, "DELETE", "/admin/learn/transcripts/0123456789abcdef", admin, &j,
                      NULL), 404);
    cr_assert_str_eq(err_code(j), "unknown_tenant");
    cr_assert(strstr(err_msg(j), "0123456789abcdef"), "%s", err_msg(j));
    json_decref(j);
    /* malformed ids, and none */
    static const char *const bad[] = {"/admin/learn/transcripts/xyz",
                                      "/admin/learn/transcripts/0123456789ABCDEF",
                                      "/admin/learn/transcripts/0123456789abcdeg",
                                      "/admin/learn/transcripts/", "/admin/learn/transcripts"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        cr_assert_eq(call(&d, "DELETE", bad[i], admin, &j, NULL), 400, "%s", bad[i]);
        cr_assert_str_eq(err_code(j), "invalid_tenant", "%s", bad[i]);
        cr_assert(strstr(err_msg(j), "tenant"), "%s: %s", bad[i], err_msg(j));
        json_decref(j);
    }
    cr_assert_eq(h_count_files(fb, ".kvtx"), 1);
    /* the tenant's own form takes DELETE only */
    cr_assert_eq(call(&d, "GET", "/v1/learn/transcripts", KB, &j, NULL), 405);
    cr_assert(strstr(err_msg(j), "DELETE"), "%s", err_msg(j));
    json_decref(j);
    char *ans = NULL;
    const char *body = NULL;
    cr_assert_eq(h_request(d.port, "POST", "/v1/learn/transcripts", KB, "{}", &ans, &body), 405);
    free(ans);
    cr_assert_eq(h_count_files(fb, ".kvtx"), 1);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    rm_tree(learn);
}

Test(learn_tenants, without_keys_the_folder_is_default_and_without_learn_dir_deleting_is_404)
{
    char learn[64], fd[128];
    cr_assert_eq(h_mkdtemp(learn, sizeof learn), 0);
    folder(learn, "default", fd, sizeof fd);
    kvpd_proc d;
    start(&d, learn, "");
    converse(&d, NULL, ONE_TURN("Once upon a time"), NULL);
    wait_files(fd, 1);
    char admin[256];
    snprintf(admin, sizeof admin, "Authorization: Bearer %s\r\n", h_admin_token(&d));
    json_t *j;
    cr_assert_eq(call(&d, "DELETE", "/admin/learn/transcripts/default", admin, &j, NULL), 200);
    cr_assert_eq(json_integer_value(json_object_get(j, "deleted")), 1);
    json_decref(j);
    cr_assert_eq(h_count_files(fd, ".kvtx"), 0);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    rm_tree(learn);

    cr_assert_eq(kvpd_start(&d, "--api-key key-a"), 0, "log %s", d.log);
    snprintf(admin, sizeof admin, "Authorization: Bearer %s\r\n", h_admin_token(&d));
    cr_assert_eq(call(&d, "DELETE", "/v1/learn/transcripts", KA, &j, NULL), 404);
    cr_assert(strstr(err_msg(j), "learn_dir"), "%s", err_msg(j));
    json_decref(j);
    char ta[17], path[128];
    tenant_of("key-a", ta);
    snprintf(path, sizeof path, "/admin/learn/transcripts/%s", ta);
    cr_assert_eq(call(&d, "DELETE", path, admin, &j, NULL), 404);
    cr_assert(strstr(err_msg(j), "learn_dir"), "%s", err_msg(j));
    json_decref(j);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

/* The ids of a conversation's transcript file (the name is a hash of its session id). */
static int *read_ids(const char *dir, const char *sid, int *n)
{
    char path[256], err[512];
    snprintf(path, sizeof path, "%s/%016llx.kvtx", dir,
             (unsigned long long)kvp_fnv1a(KVP_FNV1A_INIT, sid, strlen(sid)));
    int *ids = NULL;
    uint64_t fp;
    cr_assert_eq(kvp_tokfile_read(path, 0, &ids, n, &fp, err, sizeof err), 0, "%s", err);
    return ids;
}

#define SYSTEM "You are a zebra named Zed who lives in a big green zoo with many friends."
#define WITH_SYSTEM                                                                        \
    "{\"messages\":[{\"role\":\"system\",\"content\":\"" SYSTEM "\"},"                      \
    "{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":1,\"temperature\":0}"
#define WITHOUT_SYSTEM                                                                     \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":1," \
    "\"temperature\":0}"

/* With learn_exclude_system the conversation with a system prompt is kept as the same
 * conversation without one is (its reply aside); without the setting it is kept whole,
 * longer by the system prompt's tokens. */
Test(learn_tenants, learn_exclude_system_leaves_the_system_prompts_tokens_out)
{
    char learn[64], fd[128], s1[64], s2[64], s3[64];
    cr_assert_eq(h_mkdtemp(learn, sizeof learn), 0);
    folder(learn, "default", fd, sizeof fd);
    kvpd_proc d;
    /* zephyr: a template stories260K's vocabulary renders system prompts with */
    start(&d, learn, "--learn-exclude-system true --chat-template zephyr");
    cr_assert(kvpd_log_has(&d, "without their system prompts"), "log %s", d.log);
    converse(&d, NULL, WITH_SYSTEM, s1);
    converse(&d, NULL, WITHOUT_SYSTEM, s2);
    wait_files(fd, 2);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    int n1, n2, n3;
    int *t1 = read_ids(fd, s1, &n1), *t2 = read_ids(fd, s2, &n2);
    /* the replies (the last token of each) may differ: the model saw the system prompt */
    cr_assert_eq(n1, n2, "kept %d tokens with the system prompt, %d without one", n1, n2);
    cr_assert_gt(n1, 2);
    cr_assert_arr_eq(t1, t2, (size_t)(n1 - 1) * sizeof *t1,
                     "the transcript with the system prompt left out is not the one without");
    free(t2);
    rm_tree(learn);

    /* the same conversation without the setting: whole */
    cr_assert_eq(h_mkdtemp(learn, sizeof learn), 0);
    folder(learn, "default", fd, sizeof fd);
    start(&d, learn, "--chat-template zephyr");
    cr_assert(kvpd_log_has(&d, "system prompts included"), "log %s", d.log);
    converse(&d, NULL, WITH_SYSTEM, s3);
    wait_files(fd, 1);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    int *t3 = read_ids(fd, s3, &n3);
    cr_assert_gt(n3, n1 + 10, "the system prompt's tokens (%d kept whole, %d without them)", n3,
                 n1);
    free(t1);
    free(t3);
    rm_tree(learn);
}

/* kvp learn --transcripts DIR's count of usable transcripts (it stops there: fewer than
 * --min-transcripts), with its exit status. */
static int learn_count(const char *dir, const char *work, int *status)
{
    char cmd[2048];
    snprintf(cmd, sizeof cmd, "%s learn --model %s --tokenizer %s --transcripts %s --work %s "
             "--out %s/none.kvp --min-transcripts 1000 2>&1", h_build("tools/kvp"),
             h_shared("models/stories260K.bin"), h_shared("models/tok512.bin"), dir, work, work);
    FILE *p = popen(cmd, "r");
    cr_assert(p);
    static char out[1 << 16];
    size_t n = fread(out, 1, sizeof out - 1, p);
    out[n] = '\0';
    int st = pclose(p);
    *status = WIFEXITED(st) ? WEXITSTATUS(st) : -1;
    const char *at = strstr(out, " usable transcripts");
    cr_assert(at, "%s", out);
    while (at > out && at[-1] >= '0' && at[-1] <= '9')
        at--;
    return atoi(at);
}

Test(learn_tenants, kvp_learn_reads_the_whole_learn_dir_or_one_tenants_folder)
{
    char learn[64], work[64], ta[17], tb[17], fa[128], fb[128];
    cr_assert_eq(h_mkdtemp(work, sizeof work), 0);
    kvpd_proc d;
    start_two_keys(&d, learn, ta, tb, fa, fb, 2);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    int status;
    cr_assert_eq(learn_count(learn, work, &status), 3, "the whole learn_dir");
    cr_assert_eq(status, 3);
    cr_assert_eq(learn_count(fa, work, &status), 2, "A's folder");
    cr_assert_eq(learn_count(fb, work, &status), 1, "B's folder");
    rm_tree(learn);
    rm_tree(work);
}
