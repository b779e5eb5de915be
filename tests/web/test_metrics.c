/* web/metrics.c: the protocol's error codes mapped to their counters, and the exposition
 * text as Prometheus 0.0.4 reads it (every sample under a family declared before it,
 * counters named _total, cumulative buckets ending at +Inf = _count). */
#include <criterion/criterion.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "web/metrics.h"

Test(metrics, error_codes_map_to_their_counters)
{
    cr_assert_eq(kvpd_err_kind_of("busy"), KVPD_ERR_BUSY);
    cr_assert_eq(kvpd_err_kind_of("bad_json"), KVPD_ERR_BAD_JSON);
    cr_assert_eq(kvpd_err_kind_of("overloaded"), KVPD_ERR_OVERLOADED);
    cr_assert_eq(kvpd_err_kind_of("no such code"), KVPD_ERR_INTERNAL);
}

/* The families declared so far: name and type. */
typedef struct fams {
    int n;
    char name[256][96], type[256][16];
} fams;

static const char *type_of(const fams *f, const char *name)
{
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->name[i], name))
            return f->type[i];
    return NULL;
}

/* A sample's family: its name, less a histogram's _bucket, _sum or _count. */
static const char *family_of(const fams *f, const char *sample, char *buf, size_t cap)
{
    snprintf(buf, cap, "%s", sample);
    if (type_of(f, buf))
        return type_of(f, buf);
    static const char *const tails[] = {"_bucket", "_sum", "_count"};
    for (int k = 0; k < 3; k++) {
        size_t n = strlen(sample), m = strlen(tails[k]);
        if (n > m && !strcmp(sample + n - m, tails[k])) {
            snprintf(buf, cap, "%.*s", (int)(n - m), sample);
            const char *t = type_of(f, buf);
            if (t && !strcmp(t, "histogram"))
                return t;
        }
    }
    return NULL;
}

Test(metrics, the_exposition_text_is_well_formed)
{
    static kvpd_metrics m;
    kvpd_metrics_init(&m);
    kvpd_hist_observe(&m.ttft, 0.002);
    kvpd_hist_observe(&m.ttft, 0.2);
    kvpd_hist_observe(&m.ttft, 100);
    kvpd_hist_observe(&m.snapshot_bytes, 5000);
    m.turns = 7;
    m.errors[KVPD_ERR_BUSY] = 2;
    kvpd_labelled_add(&m.http_by_path, "/healthz", 200);
    kvpd_labelled_add(&m.api_errors, "rate_limit", 429);
    kvpd_canary_observe(&m, "kvp", 64, 0.001, 0.98);
    m.reused_shared = 11;
    kvpd_gauges g = {.sessions_active = 3, .ready = 1, .uptime_s = 1.5, .store_errors = 4};
    size_t len = 0;
    char *text = kvpd_metrics_render(&m, &g, &len);
    cr_assert(text);
    cr_assert_eq(strlen(text), len);
    cr_assert_eq(text[len - 1], '\n');

    static fams f;
    memset(&f, 0, sizeof f);
    int samples = 0, helps = 0;
    char *save = NULL;
    for (char *line = strtok_r(text, "\n", &save); line; line = strtok_r(NULL, "\n", &save)) {
        char name[96], type[16];
        if (!strncmp(line, "# HELP ", 7)) {
            helps++;
            continue;
        }
        if (sscanf(line, "# TYPE %95s %15s", name, type) == 2) {
            cr_assert_null(type_of(&f, name), "%s declared twice", name);
            cr_assert(!strcmp(type, "counter") || !strcmp(type, "gauge") ||
                      !strcmp(type, "histogram"), "%s", line);
            if (!strcmp(type, "counter"))
                cr_assert(strlen(name) > 6 && !strcmp(name + strlen(name) - 6, "_total"),
                          "the counter %s does not end in _total", name);
            cr_assert_lt(f.n, 256);
            snprintf(f.name[f.n], sizeof f.name[0], "%s", name);
            snprintf(f.type[f.n++], sizeof f.type[0], "%s", type);
            continue;
        }
        cr_assert_neq(line[0], '#', "%s", line);
        size_t k = strcspn(line, "{ ");
        cr_assert_lt(k, sizeof name);
        snprintf(name, sizeof name, "%.*s", (int)k, line);
        char fam[96];
        cr_assert_not_null(family_of(&f, name, fam, sizeof fam),
                           "%s: no family declared before it", line);
        const char *value = strrchr(line, ' ');
        cr_assert(value);
        char *end;
        strtod(value + 1, &end);
        cr_assert_eq(*end, '\0', "%s: not a number", line);
        samples++;
    }
    cr_assert_eq(helps, f.n, "a HELP for every family");
    cr_assert_gt(samples, 100);
    free(text);

    /* and the values where they belong */
    text = kvpd_metrics_render(&m, &g, &len);
    static const char *const want[] = {
        "kvpd_up 1\n",
        "kvpd_sessions_resident 3\n",
        "kvpd_turns_total 7\n",
        "kvpd_errors_total{code=\"busy\"} 2\n",
        "kvpd_http_requests_total{path=\"/healthz\",status=\"200\"} 1\n",
        "kvpd_api_errors_total{status=\"429\",code=\"rate_limit\"} 1\n",
        "kvpd_ttft_seconds_bucket{le=\"0.0025\"} 1\n",
        "kvpd_ttft_seconds_bucket{le=\"1\"} 2\n",
        "kvpd_ttft_seconds_bucket{le=\"+Inf\"} 3\n",
        "kvpd_ttft_seconds_count 3\n",
        "kvpd_snapshot_bytes_bucket{le=\"4096\"} 0\n",
        "kvpd_snapshot_bytes_bucket{le=\"16384\"} 1\n",
        "kvpd_eviction_kl_bucket{policy=\"kvp\",budget=\"64\",le=\"0.001\"} 1\n",
        "kvpd_eviction_kl_count{policy=\"kvp\",budget=\"64\"} 1\n",
        "kvpd_store_errors_total 4\n",
        "kvpd_reused_tokens_total{source=\"shared\"} 11\n",
        "kvpd_eviction_canary_runs_total 1\n",
    };
    for (size_t i = 0; i < sizeof want / sizeof *want; i++)
        cr_assert(strstr(text, want[i]), "missing: %s", want[i]);
    free(text);
}
