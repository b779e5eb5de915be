/* config/config.c: defaults, file parsing, flags over file over defaults. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "config/config.h"
#include "policy/policy.h"

static const char *write_tmp(const char *text)
{
    static char path[64];
    snprintf(path, sizeof path, "/tmp/kvpd-conf-XXXXXX");
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    cr_assert_eq(write(fd, text, strlen(text)), (ssize_t)strlen(text));
    close(fd);
    return path;
}

Test(config, defaults)
{
    kvpd_config c;
    kvpd_config_defaults(&c);
    cr_assert_str_eq(c.listen_host, "127.0.0.1");
    cr_assert_eq(c.listen_port, 8080);
    cr_assert(strstr(c.model, "models/stories260K.bin"));
    cr_assert_eq(c.reuse_cache, 1);
    cr_assert_eq(c.share_rows, 1);           /* forks share their rows */
    cr_assert_eq(c.admin_token[0], '\0');
    cr_assert_eq(c.kv_type, KVP_KV_Q8_0);    /* quality per byte: docs/quality-per-byte.md */
    cr_assert_eq(c.budget_mode, KVP_BUDGET_PER_HEAD);
}

Test(config, flags_override_file_override_defaults)
{
    const char *path = write_tmp("# comment\n\nbudget = 100  # trailing\nworkers=3\n"
                                 "admin_token = \"tok en\"\nlisten = 0.0.0.0:9000\n");
    char *argv[] = {"kvpd", "--budget", "7", "--config", (char *)path, "--max-tokens=12",
                    "--no-reuse-cache", NULL};
    kvpd_config c;
    enum kvpd_action a;
    char err[256];
    cr_assert_eq(kvpd_config_from_args(&c, 7, argv, &a, err, sizeof err), 0, "%s", err);
    unlink(path);
    cr_assert_eq(a, KVPD_RUN);
    cr_assert_eq(c.budget, 7);            /* flag beats file */
    cr_assert_eq(c.workers, 3);           /* file beats default */
    cr_assert_eq(c.max_tokens, 12);
    cr_assert_eq(c.reuse_cache, 0);
    cr_assert_str_eq(c.admin_token, "tok en");
    cr_assert_str_eq(c.listen_host, "0.0.0.0");
    cr_assert_eq(c.listen_port, 9000);
    cr_assert_eq(c.chunk, 32);            /* default */
}

Test(config, actions)
{
    kvpd_config c;
    enum kvpd_action a;
    char err[256];
    char *v[] = {"kvpd", "--version", NULL}, *h[] = {"kvpd", "--budget", "1", "--help", NULL},
         *k[] = {"kvpd", "--check-config", NULL};
    cr_assert_eq(kvpd_config_from_args(&c, 2, v, &a, err, sizeof err), 0);
    cr_assert_eq(a, KVPD_VERSION);
    cr_assert_eq(kvpd_config_from_args(&c, 4, h, &a, err, sizeof err), 0);
    cr_assert_eq(a, KVPD_HELP);
    cr_assert_eq(kvpd_config_from_args(&c, 2, k, &a, err, sizeof err), 0);
    cr_assert_eq(a, KVPD_CHECK);
}

Test(config, rejects_bad_values_with_a_reason)
{
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    cr_assert_lt(kvpd_config_set(&c, "budget", "-1", err, sizeof err), 0);
    cr_assert(strstr(err, "budget"));
    cr_assert_lt(kvpd_config_set(&c, "budget", "12x", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "chunk", "0", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "top_p", "1.5", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "temperature", "nan", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "reuse_cache", "maybe", err, sizeof err), 0);
    const char *bad_share[] = {"maybe", "", "2", "-1", "true ", "yes\n"};
    for (size_t i = 0; i < sizeof bad_share / sizeof bad_share[0]; i++) {
        err[0] = 0;
        cr_assert_lt(kvpd_config_set(&c, "share_rows", bad_share[i], err, sizeof err), 0,
                     "share_rows = \"%s\" was taken", bad_share[i]);
        cr_assert(strstr(err, "share_rows"), "the error does not name the setting: %s", err);
        cr_assert_eq(c.share_rows, 1, "a refused value changed the setting");
    }
    cr_assert_eq(kvpd_config_set(&c, "share_rows", "false", err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.share_rows, 0);
    cr_assert_lt(kvpd_config_set(&c, "listen", "8080", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "listen", "127.0.0.1:70000", err, sizeof err), 0);
    cr_assert_lt(kvpd_config_set(&c, "seed", "-3", err, sizeof err), 0);
    const char *bad_kv[] = {"", "q4_0", "Q8_0", "f32 ", "1", "q8_0\n"};
    for (size_t i = 0; i < sizeof bad_kv / sizeof bad_kv[0]; i++) {
        cr_assert_lt(kvpd_config_set(&c, "kv_type", bad_kv[i], err, sizeof err), 0, "'%s'", bad_kv[i]);
        cr_assert(strstr(err, "kv_type: expected one of f32 f16 q8_0"), "%s", err);
    }
    cr_assert_eq(c.kv_type, KVP_KV_Q8_0, "a refused value left the key alone");
    cr_assert_eq(kvpd_config_set(&c, "kv_type", "f16", err, sizeof err), 0);
    cr_assert_eq(c.kv_type, KVP_KV_F16);
    const char *bad_mode[] = {"", "Global", "per-head", "0", "global "};
    for (size_t i = 0; i < sizeof bad_mode / sizeof bad_mode[0]; i++) {
        cr_assert_lt(kvpd_config_set(&c, "budget_mode", bad_mode[i], err, sizeof err), 0, "'%s'", bad_mode[i]);
        cr_assert(strstr(err, "budget_mode: expected per_head or global"), "%s", err);
    }
    cr_assert_eq(c.budget_mode, 0);
    cr_assert_eq(kvpd_config_set(&c, "budget_mode", "global", err, sizeof err), 0);
    cr_assert_eq(c.budget_mode, 1);
    cr_assert_lt(kvpd_config_set(&c, "nope", "1", err, sizeof err), 0);
    cr_assert(strstr(err, "unknown key"));
    cr_assert_eq(kvpd_config_set(&c, "listen", "[::1]:81", err, sizeof err), 0);
    cr_assert_str_eq(c.listen_host, "::1");
    cr_assert_eq(c.listen_port, 81);
    char longv[1000];
    memset(longv, 'x', sizeof longv - 1);
    longv[sizeof longv - 1] = '\0';
    cr_assert_lt(kvpd_config_set(&c, "model", longv, err, sizeof err), 0);
}

Test(config, file_errors_name_the_line)
{
    const char *path = write_tmp("budget = 10\nthis line has no equals\n");
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    cr_assert_lt(kvpd_config_load_file(&c, path, err, sizeof err), 0);
    cr_assert(strstr(err, ":2:"), "%s", err);
    unlink(path);
    cr_assert_lt(kvpd_config_load_file(&c, "/nonexistent/kvpd.conf", err, sizeof err), 0);
    char *argv[] = {"kvpd", "--budget", NULL};
    enum kvpd_action a;
    cr_assert_lt(kvpd_config_from_args(&c, 2, argv, &a, err, sizeof err), 0);
    char *argv2[] = {"kvpd", "--what", "1", NULL};
    cr_assert_lt(kvpd_config_from_args(&c, 3, argv2, &a, err, sizeof err), 0);
}

Test(config, validate)
{
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    snprintf(c.static_dir, sizeof c.static_dir, "/tmp");
    cr_assert_eq(kvpd_config_validate(&c, err, sizeof err), 0, "%s", err);
    snprintf(c.policy, sizeof c.policy, "kvp");
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
    snprintf(c.policy, sizeof c.policy, "h2o");
    snprintf(c.state_dir, sizeof c.state_dir, "/nonexistent-dir");
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
}

/* The evaluation-only oracle is refused wherever a policy is named (flag, file; SIGHUP
 * validates the same way: tests/daemon/test_reload.c), with the allowed names. */
Test(config, oracle_is_refused_naming_the_allowed_policies)
{
    kvpd_config c;
    enum kvpd_action action;
    char err[512];
    char *argv[] = {"kvpd", "--policy", "oracle", "--static-dir", "/tmp", NULL};
    cr_assert_eq(kvpd_config_from_args(&c, 5, argv, &action, err, sizeof err), 0, "%s", err);
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
    cr_assert(strstr(err, "oracle") && strstr(err, "evaluation"), "%s", err);
    cr_assert(strstr(err, "none random streaming"), "%s", err);
    cr_assert_null(strstr(strstr(err, "one of:"), "oracle"), "%s", err);
    char conf[64];
    snprintf(conf, sizeof conf, "%s", write_tmp("policy = oracle\nstatic_dir = /tmp\n"));
    char *argv2[] = {"kvpd", "--config", conf, NULL};
    cr_assert_eq(kvpd_config_from_args(&c, 3, argv2, &action, err, sizeof err), 0, "%s", err);
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
    cr_assert(strstr(err, "evaluation"), "%s", err);
    unlink(conf);
    /* so is KVzip, the other evaluation-only policy */
    char *argv3[] = {"kvpd", "--policy", "kvzip", "--static-dir", "/tmp", NULL};
    cr_assert_eq(kvpd_config_from_args(&c, 5, argv3, &action, err, sizeof err), 0, "%s", err);
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
    cr_assert(strstr(err, "policy kvzip is for evaluation only"), "%s", err);
    cr_assert_null(strstr(strstr(err, "one of:"), "kvzip"), "%s", err);
}

Test(config, byte_counts_take_suffixes)
{
    kvpd_config c;
    kvpd_config_defaults(&c);
    char err[256];
    cr_assert_eq(c.max_cache_bytes, 0);
    cr_assert_eq(kvpd_config_set(&c, "max_cache_bytes", "1048576", err, sizeof err), 0);
    cr_assert_eq(c.max_cache_bytes, 1048576);
    cr_assert_eq(kvpd_config_set(&c, "max_cache_bytes", "64k", err, sizeof err), 0);
    cr_assert_eq(c.max_cache_bytes, 65536);
    cr_assert_eq(kvpd_config_set(&c, "max_cache_bytes", "3M", err, sizeof err), 0);
    cr_assert_eq(c.max_cache_bytes, 3u << 20);
    cr_assert_eq(kvpd_config_set(&c, "max_cache_bytes", "2G", err, sizeof err), 0);
    cr_assert_eq(c.max_cache_bytes, 2ull << 30);
    const char *bad[] = {"-1", "", "12x", "1MB", "k", "99999999999999999999G"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_lt(kvpd_config_set(&c, "max_cache_bytes", bad[i], err, sizeof err), 0,
                     "'%s' accepted", bad[i]);
    cr_assert_eq(c.max_cache_bytes, 2ull << 30, "a refused value changed the key");
}

Test(config, default_policy_is_kvp_with_the_models_weights_when_present)
{
    char dir[] = "/tmp/kvpd-weights-XXXXXX";
    cr_assert_not_null(mkdtemp(dir));
    kvpd_config c;
    kvpd_config_defaults(&c);
    cr_assert_str_eq(c.policy, "", "no policy configured by default");
    cr_assert(strstr(c.policy_dir, "policy/weights"));
    snprintf(c.policy_dir, sizeof c.policy_dir, "%s", dir);
    snprintf(c.model, sizeof c.model, "/models/stories260K.bin");
    char name[32], file[1024], want[1024];
    snprintf(want, sizeof want, "%s/stories260K.kvp", dir);
    cr_assert_eq(kvpd_config_default_policy(&c, name, sizeof name, file, sizeof file), 0);
    cr_assert_str_eq(name, "streaming");
    cr_assert_str_eq(file, want, "the path looked at");
    FILE *f = fopen(want, "w");
    cr_assert(f);
    fclose(f);
    cr_assert_eq(kvpd_config_default_policy(&c, name, sizeof name, file, sizeof file), 1);
    cr_assert_str_eq(name, "kvp");
    cr_assert_str_eq(file, want);
    /* The stem drops only the last extension, and the directory. */
    snprintf(c.model, sizeof c.model, "stories260K.q8.gguf");
    cr_assert_eq(kvpd_config_default_policy(&c, name, sizeof name, file, sizeof file), 0);
    cr_assert(strstr(file, "/stories260K.q8.kvp"), "%s", file);
    unlink(want);
    rmdir(dir);
}

Test(config, reload_applies_live_keys_and_lists_the_others)
{
    kvpd_config cur, next;
    kvpd_config_defaults(&cur);
    kvpd_config_defaults(&next);
    char fixed[256];
    kvpd_config_apply_live(&cur, &next, fixed, sizeof fixed);
    cr_assert_str_eq(fixed, "");
    snprintf(next.policy, sizeof next.policy, "h2o");
    next.budget = 99;
    next.max_sessions = 3;
    next.max_cache_bytes = 12345;
    snprintf(next.admin_token, sizeof next.admin_token, "t");
    next.chunk = 7;
    next.listen_port = 1;
    snprintf(next.model, sizeof next.model, "other.gguf");
    kvpd_config_apply_live(&cur, &next, fixed, sizeof fixed);
    cr_assert_str_eq(cur.policy, "h2o");
    cr_assert_eq(cur.budget, 99);
    cr_assert_eq(cur.max_sessions, 3);
    cr_assert_eq(cur.max_cache_bytes, 12345);
    cr_assert_str_eq(cur.admin_token, "t");
    cr_assert_eq(cur.chunk, 32, "chunk is not live");
    cr_assert_eq(cur.listen_port, 8080, "listen is not live");
    cr_assert(strstr(cur.model, "stories260K.bin"), "model is not live");
    cr_assert_str_eq(fixed, "listen, model, chunk");
}

/* The sample config is derived from the table: every key is there (set, or commented
 * out) at the default its row gives; data-directory defaults are written <source>/... */
Test(config, sample_config_lists_every_key_at_its_default)
{
    const char *src = getenv("KVP_SOURCE") ? getenv("KVP_SOURCE") : ".";
    char path[1024];
    snprintf(path, sizeof path, "%s/systemd/kvpd.conf", src);
    FILE *f = fopen(path, "r");
    cr_assert(f, "%s", path);
    static char text[1 << 16];
    size_t n = fread(text, 1, sizeof text - 1, f);
    fclose(f);
    text[n] = '\0';
    const char *name, *dflt;
    int live, keys = 0;
    for (size_t i = 0; kvpd_config_key(i, &name, &dflt, &live); i++, keys++) {
        char value[1024], line[1200];
        size_t sl = strlen(src);
        if (!strncmp(dflt, src, sl) && dflt[sl] == '/')
            snprintf(value, sizeof value, "<source>%s", dflt + sl);
        else
            snprintf(value, sizeof value, "%s", dflt);
        snprintf(line, sizeof line, "\n%s = %s\n", name, value);
        char commented[1200];
        snprintf(commented, sizeof commented, value[0] ? "\n#%s = %s\n" : "\n#%s =%s\n", name,
                 value);
        cr_assert(strstr(text, line) || strstr(text, commented),
                  "systemd/kvpd.conf has no line '%s = %s'", name, value);
    }
    cr_assert_gt(keys, 20);
}

Test(config, chat_template_names)
{
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    snprintf(c.static_dir, sizeof c.static_dir, "/tmp");
    static const char *const good[] = {"", "plain", "chatml", "llama2", "llama3", "mistral",
                                       "zephyr", "phi3", "gemma"};
    for (size_t i = 0; i < sizeof good / sizeof good[0]; i++) {
        snprintf(c.chat_template, sizeof c.chat_template, "%s", good[i]);
        cr_assert_eq(kvpd_config_validate(&c, err, sizeof err), 0, "%s: %s", good[i], err);
    }
    snprintf(c.chat_template, sizeof c.chat_template, "ChatML");
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
    cr_assert(strstr(err, "chat_template 'ChatML'"), "%s", err);
    /* longer than any name: refused when set */
    cr_assert_lt(kvpd_config_set(&c, "chat_template", "a-template-name-far-too-long", err,
                                 sizeof err), 0);
}

Test(config, a_hash_inside_a_quoted_value_is_part_of_it)
{
    const char *path = write_tmp("admin_token = \"Zq#9xV2LmP7rT4kW\"  # the comment\n"
                                 "api_key = \"  spaced # key \"\n"
                                 "node_id = n1 # unquoted: the comment starts at '#'\n"
                                 "# a whole-line comment with = in it\n");
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    cr_assert_eq(kvpd_config_load_file(&c, path, err, sizeof err), 0, "%s", err);
    unlink(path);
    cr_assert_str_eq(c.admin_token, "Zq#9xV2LmP7rT4kW");
    cr_assert_str_eq(c.api_key, "  spaced # key ");
    cr_assert_str_eq(c.node_id, "n1");
    /* an unclosed quote or text after the closing one is an error naming the line */
    path = write_tmp("budget = 10\nadmin_token = \"Zq#9xV2\n");
    cr_assert_lt(kvpd_config_load_file(&c, path, err, sizeof err), 0);
    cr_assert(strstr(err, ":2:") && strstr(err, "quote"), "%s", err);
    unlink(path);
    path = write_tmp("admin_token = \"ab\" cd\n");
    cr_assert_lt(kvpd_config_load_file(&c, path, err, sizeof err), 0);
    cr_assert(strstr(err, ":1:") && strstr(err, "quote"), "%s", err);
    unlink(path);
}

/* An unquoted '#' right after other text is more likely part of a secret than a comment:
 * the line is refused naming the key and the line, for every key, not only api_key. */
Test(config, an_unquoted_hash_after_text_is_refused_naming_the_key)
{
    const char *bad[][2] = {
        {"api_key = k3y#with-a-hash-in-it\n", "api_key"},
        {"budget = 10\nadmin_token = ab#cd  # and a comment\n", "admin_token"},
        {"node_id = n1#\n", "node_id"},
        {"budget=64#\n", "budget"},
    };
    kvpd_config c;
    char err[256];
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        const char *path = write_tmp(bad[i][0]);
        kvpd_config_defaults(&c);
        cr_assert_lt(kvpd_config_load_file(&c, path, err, sizeof err), 0, "%s", bad[i][0]);
        cr_assert(strstr(err, bad[i][1]) && strstr(err, "#") && strstr(err, "quote"),
                  "%s: %s", bad[i][0], err);
        cr_assert(strstr(err, i == 1 ? ":2:" : ":1:"), "%s", err);
        unlink(path);
    }
    /* a key made of what came before the '#' is never installed */
    const char *path = write_tmp("api_key = k3y#with-a-hash-in-it\n");
    kvpd_config_defaults(&c);
    kvpd_config_load_file(&c, path, err, sizeof err);
    unlink(path);
    cr_assert_neq(strcmp(c.api_key, "k3y"), 0);
    /* the forms that stay valid: quoted, a blank before the comment, a tab before it */
    path = write_tmp("api_key = \"k3y#with-a-hash-in-it\"\nnode_id = n1 # c\n"
                     "admin_token = Zq9xV2LmP7rT4kW\t# c\nbudget = 10\n");
    kvpd_config_defaults(&c);
    cr_assert_eq(kvpd_config_load_file(&c, path, err, sizeof err), 0, "%s", err);
    unlink(path);
    cr_assert_str_eq(c.api_key, "k3y#with-a-hash-in-it");
    cr_assert_str_eq(c.node_id, "n1");
    cr_assert_str_eq(c.admin_token, "Zq9xV2LmP7rT4kW");
}

Test(config, snapshot_ttl_below_idle_timeout_is_refused)
{
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    c.idle_timeout_s = 600;
    c.snapshot_ttl_s = 60;
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
    cr_assert(strstr(err, "snapshot_ttl") && strstr(err, "idle_timeout"), "%s", err);
    c.snapshot_ttl_s = 600;
    cr_assert_eq(kvpd_config_validate(&c, err, sizeof err), 0, "%s", err);
    c.snapshot_ttl_s = 0;   /* forever */
    cr_assert_eq(kvpd_config_validate(&c, err, sizeof err), 0, "%s", err);
}

/* A state_dir kvpd cannot write to is refused at start. Root writes anywhere, so the
 * check runs in a child that became an unprivileged user. */
Test(config, a_read_only_state_dir_is_refused)
{
    char dir[] = "/tmp/kvpd-ro-XXXXXX";
    cr_assert(mkdtemp(dir));
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    snprintf(c.state_dir, sizeof c.state_dir, "%s", dir);
    cr_assert_eq(kvpd_config_validate(&c, err, sizeof err), 0, "%s", err);
    cr_assert_eq(chmod(dir, 0555), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        if (geteuid() == 0 && (chown(dir, 65534, 65534) < 0 || setgid(65534) < 0 ||
                               setuid(65534) < 0))
            _exit(3);
        int rc = kvpd_config_validate(&c, err, sizeof err);
        _exit(rc < 0 && strstr(err, "not writable") ? 0 : 1);
    }
    int status;
    cr_assert_eq(waitpid(pid, &status, 0), pid);
    chmod(dir, 0755);
    rmdir(dir);
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0, "exit %d",
              WIFEXITED(status) ? WEXITSTATUS(status) : -1);
}

/* The default state_dir, auto: systemd's directory, else XDG's, else ~/.local/state,
 * made 0700; none with Redis; an explicit value is left alone. */
Test(config, state_dir_auto_resolves_and_is_made)
{
    char base[] = "/tmp/kvpd-auto-XXXXXX", want[128], err[256];
    cr_assert(mkdtemp(base));
    kvpd_config c;
    kvpd_config_defaults(&c);
    cr_assert_str_eq(c.state_dir, "auto");
    unsetenv("STATE_DIRECTORY");
    setenv("XDG_STATE_HOME", base, 1);
    cr_assert_eq(kvpd_config_resolve_state_dir(&c, err, sizeof err), 0, "%s", err);
    snprintf(want, sizeof want, "%s/kvpd", base);
    cr_assert_str_eq(c.state_dir, want);
    struct stat st;
    cr_assert_eq(stat(want, &st), 0);
    cr_assert(S_ISDIR(st.st_mode) && (st.st_mode & 0777) == 0700);
    cr_assert_eq(kvpd_config_validate(&c, err, sizeof err), 0, "%s", err);
    rmdir(want);
    /* no XDG: HOME's .local/state */
    unsetenv("XDG_STATE_HOME");
    setenv("HOME", base, 1);
    snprintf(c.state_dir, sizeof c.state_dir, "auto");
    cr_assert_eq(kvpd_config_resolve_state_dir(&c, err, sizeof err), 0, "%s", err);
    snprintf(want, sizeof want, "%s/.local/state/kvpd", base);
    cr_assert_str_eq(c.state_dir, want);
    cr_assert_eq(stat(want, &st), 0);
    /* systemd's wins */
    setenv("STATE_DIRECTORY", "/var/lib/kvpd-test-none:/other", 1);
    snprintf(c.state_dir, sizeof c.state_dir, "auto");
    snprintf(c.state_url, sizeof c.state_url, "redis://127.0.0.1:6379");
    cr_assert_eq(kvpd_config_resolve_state_dir(&c, err, sizeof err), 0, "%s", err);
    cr_assert_str_eq(c.state_dir, "", "with state_url the snapshots are in Redis");
    unsetenv("STATE_DIRECTORY");
    c.state_url[0] = '\0';
    snprintf(c.state_dir, sizeof c.state_dir, "%s", base);
    cr_assert_eq(kvpd_config_resolve_state_dir(&c, err, sizeof err), 0);
    cr_assert_str_eq(c.state_dir, base);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", base);
    cr_assert_eq(system(cmd), 0);
}

/* prefill_tokens: an integer in 0..65536 from the file or a flag; a value between 1 and
 * chunk - 1 is refused at validation naming both keys (no step could take a chunk). */
Test(config, prefill_tokens_is_checked_naming_the_problem)
{
    kvpd_config c;
    char err[256];
    kvpd_config_defaults(&c);
    snprintf(c.static_dir, sizeof c.static_dir, "/tmp");
    cr_assert_eq(c.prefill_tokens, 0, "default: no bound beyond step_tokens");
    const char *bad[] = {"", "abc", "-1", "65537", "1e3", "64k", "0x40", " 64", "64 ", "3.5",
                         "99999999999999999999"};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        err[0] = '\0';
        cr_assert_lt(kvpd_config_set(&c, "prefill_tokens", bad[i], err, sizeof err), 0, "'%s'",
                     bad[i]);
        cr_assert(strstr(err, "prefill_tokens"), "'%s': %s", bad[i], err);
        cr_assert_eq(c.prefill_tokens, 0, "a refused value left the key alone");
    }
    cr_assert_eq(kvpd_config_set(&c, "prefill_tokens", "16", err, sizeof err), 0, "%s", err);
    cr_assert_lt(kvpd_config_validate(&c, err, sizeof err), 0);
    cr_assert(strstr(err, "prefill_tokens") && strstr(err, "chunk"), "%s", err);
    c.prefill_tokens = 32;   /* = chunk */
    cr_assert_eq(kvpd_config_validate(&c, err, sizeof err), 0, "%s", err);
    c.prefill_tokens = 0;
    cr_assert_eq(kvpd_config_validate(&c, err, sizeof err), 0, "%s", err);
    const char *path = write_tmp("prefill_tokens = 128\n");
    char *argv[] = {"kvpd", "--config", (char *)path, NULL};
    enum kvpd_action a;
    cr_assert_eq(kvpd_config_from_args(&c, 3, argv, &a, err, sizeof err), 0, "%s", err);
    cr_assert_eq(c.prefill_tokens, 128);
    char *flag[] = {"kvpd", "--config", (char *)path, "--prefill-tokens", "64", NULL};
    cr_assert_eq(kvpd_config_from_args(&c, 5, flag, &a, err, sizeof err), 0, "%s", err);
    unlink(path);
    cr_assert_eq(c.prefill_tokens, 64, "the flag beats the file");
    const char *bad_file = write_tmp("prefill_tokens = lots\n");
    cr_assert_lt(kvpd_config_load_file(&c, bad_file, err, sizeof err), 0);
    unlink(bad_file);
    cr_assert(strstr(err, "prefill_tokens") && strstr(err, ":1:"), "%s", err);
}
