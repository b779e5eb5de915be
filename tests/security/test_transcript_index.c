/* The transcript index (<state_dir>/transcripts.index, docs/openai.md): a fresh state
 * directory starts without a warning about it, and a long conversation does not grow it
 * by a line per turn without bound (it is compacted to about a line per session). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tests/daemon/harness.h"

TestSuite(security_transcript_index, .timeout = 240);

/* The log's lines with any of the words, joined into out; the count. */
static int log_lines_with(const kvpd_proc *p, const char *const *words, char *out, size_t n)
{
    FILE *f = fopen(p->log, "r");
    cr_assert(f, "no log %s", p->log);
    char line[2048];
    int found = 0;
    out[0] = '\0';
    while (fgets(line, sizeof line, f)) {
        for (const char *const *w = words; *w; w++)
            if (strstr(line, *w)) {
                found++;
                size_t have = strlen(out);
                snprintf(out + have, n - have, "%s", line);
                break;
            }
    }
    fclose(f);
    return found;
}

/* What a spurious complaint looks like: any warning or error line (kvpd's and lws's). */
static const char *const SPURIOUS[] = {"No such file", "warning:", "error:", NULL};

Test(security_transcript_index, a_fresh_state_dir_starts_without_a_warning)
{
    char dir[64], args[128], found[4096];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--state-dir %s", dir);
    for (int run = 0; run < 2; run++) {   /* fresh, then with the index the first left */
        kvpd_proc d;
        cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
        ws_client c;
        cr_assert_eq(h_connect(&d, &c), 0);
        json_t *done = h_turn(&c, "Once upon a time", 2, NULL);
        cr_assert(done);
        cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done");
        json_decref(done);
        ws_close(&c);
        cr_assert_eq(kvpd_log_has(&d, "listening on"), 1);
        int n = log_lines_with(&d, SPURIOUS, found, sizeof found);
        cr_assert_eq(n, 0, "run %d logged:\n%s", run, found);
        cr_assert_eq(kvpd_stop(&d, 10000), 0);
    }
    char path[128];
    struct stat st;
    snprintf(path, sizeof path, "%s/transcripts.index", dir);
    cr_assert_eq(stat(path, &st), 0, "no %s", path);
    h_rmdir(dir);
}

/* More turns than the index's compaction threshold holds lines of (64 KB at about 55
 * bytes a line): without compaction the file would be past it. */
#define TURNS 1400
#define INDEX_BOUND (64 * 1024)

static long lines_of(const char *path, long *bytes)
{
    FILE *f = fopen(path, "r");
    cr_assert(f, "no %s", path);
    long n = 0;
    int ch;
    *bytes = 0;
    while ((ch = fgetc(f)) != EOF) {
        n += ch == '\n';
        ++*bytes;
    }
    fclose(f);
    return n;
}

Test(security_transcript_index, a_long_conversation_does_not_grow_the_index_a_line_per_turn)
{
    char dir[64], args[160], path[128];
    cr_assert_eq(h_mkdtemp(dir, sizeof dir), 0);
    snprintf(args, sizeof args, "--state-dir %s --max-history-tokens 64", dir);
    snprintf(path, sizeof path, "%s/transcripts.index", dir);
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    ws_client c;
    cr_assert_eq(h_connect(&d, &c), 0);
    for (int i = 0; i < TURNS; i++) {
        json_t *done = h_turn(&c, "Hi", 1, NULL);
        cr_assert(done, "turn %d", i);
        cr_assert_str_eq(json_string_value(json_object_get(done, "type")), "done", "turn %d", i);
        json_decref(done);
    }
    ws_close(&c);
    long bytes, lines = lines_of(path, &bytes);
    cr_assert_lt(bytes, INDEX_BOUND, "the index holds %ld lines (%ld bytes) after %d turns of "
                 "one session", lines, bytes, TURNS);
    cr_assert_lt(lines, TURNS / 2, "%ld lines after %d turns", lines, TURNS);
    cr_assert_geq(lines, 1);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    /* the compacted index still names the session: the last line of its id is read */
    cr_assert_eq(kvpd_start(&d, args), 0, "log %s", d.log);
    char found[4096];
    cr_assert_eq(log_lines_with(&d, SPURIOUS, found, sizeof found), 0, "%s", found);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
    h_rmdir(dir);
}
