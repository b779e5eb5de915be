/* store/store_live.c: the live set (kvp_store_set_live replacing it, kvp_store_live_add
 * adding one id, membership, the sorted copy) and the binary search over sorted ids it
 * shares with the tenant quota (kvp_store_id_search, store/store.c). */
#include <criterion/criterion.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/store_impl.h"

static char g_dir[64];
static kvp_store *g_st;

static void up(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/kvp-live-XXXXXX");
    cr_assert(mkdtemp(g_dir));
    kvp_store_params p = {.state_dir = g_dir};
    char err[256];
    cr_assert_eq(kvp_store_open(&g_st, &p, err, sizeof err), 0, "%s", err);
}

static void down(void)
{
    kvp_store_close(g_st);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    cr_assert_eq(system(cmd), 0);
}

TestSuite(store_live, .init = up, .fini = down);

static int has(const char *id)
{
    pthread_mutex_lock(&g_st->live_mu);
    int yes = kvp_store_live_has_locked(g_st, id);
    pthread_mutex_unlock(&g_st->live_mu);
    return yes;
}

/* The live set as one string, "a,b,c" (sorted, as the copy gives it). */
static void listed(char *out, size_t cap)
{
    kvp_store_id *ids = NULL;
    int n = kvp_store_live_copy(g_st, &ids);
    out[0] = '\0';
    for (int i = 0; i < n; i++)
        snprintf(out + strlen(out), cap - strlen(out), "%s%s", i ? "," : "", ids[i]);
    free(ids);
}

Test(store_live, the_set_is_replaced_sorted_and_searched)
{
    char s[256];
    listed(s, sizeof s);
    cr_assert_str_eq(s, "", "empty at open");
    cr_assert_not(has("a"));

    const char *ids[] = {"delta", "alpha", NULL, "charlie", "bravo"};
    cr_assert_eq(kvp_store_set_live(g_st, ids, 5), 0);
    listed(s, sizeof s);
    cr_assert_str_eq(s, "alpha,bravo,charlie,delta", "NULL skipped, the rest sorted");
    for (int i = 0; i < 5; i++)
        if (ids[i])
            cr_assert(has(ids[i]), "%s", ids[i]);
    cr_assert_not(has("alph"));
    cr_assert_not(has("echo"));
    cr_assert_not(has(""));

    /* a new set replaces the old one whole */
    const char *next[] = {"echo"};
    cr_assert_eq(kvp_store_set_live(g_st, next, 1), 0);
    listed(s, sizeof s);
    cr_assert_str_eq(s, "echo");
    cr_assert_not(has("alpha"));
    cr_assert_eq(kvp_store_set_live(g_st, NULL, 0), 0);
    listed(s, sizeof s);
    cr_assert_str_eq(s, "");
    cr_assert_eq(kvp_store_set_live(NULL, next, 1), 0, "no store: nothing to do");
}

/* An id longer than a snapshot id can be is never live. */
Test(store_live, an_id_too_long_is_left_out)
{
    char longer[KVP_SNAPSHOT_ID_MAX + 2];
    memset(longer, 'z', sizeof longer - 1);
    longer[sizeof longer - 1] = '\0';
    const char *ids[] = {"ok", longer};
    cr_assert_eq(kvp_store_set_live(g_st, ids, 2), 0);
    char s[256];
    listed(s, sizeof s);
    cr_assert_str_eq(s, "ok");
    kvp_store_live_add(g_st, longer);
    listed(s, sizeof s);
    cr_assert_str_eq(s, "ok");
}

/* Adding keeps the set sorted and without duplicates, past its first capacity. */
Test(store_live, added_ids_go_in_order_once)
{
    const char *ids[] = {"m"};
    cr_assert_eq(kvp_store_set_live(g_st, ids, 1), 0);
    kvp_store_live_add(g_st, "z");
    kvp_store_live_add(g_st, "a");
    kvp_store_live_add(g_st, "m");
    kvp_store_live_add(g_st, "q");
    char s[256];
    listed(s, sizeof s);
    cr_assert_str_eq(s, "a,m,q,z");
    char id[16];
    for (int i = 0; i < 40; i++) {
        snprintf(id, sizeof id, "id%02d", 39 - i);
        kvp_store_live_add(g_st, id);
    }
    kvp_store_id *all = NULL;
    int n = kvp_store_live_copy(g_st, &all);
    cr_assert_eq(n, 44);
    for (int i = 1; i < n; i++)
        cr_assert_lt(strcmp(all[i - 1], all[i]), 0, "%s before %s", all[i - 1], all[i]);
    free(all);
    cr_assert(has("id00") && has("id39") && has("z"));
}

typedef struct rec {
    int other;
    kvp_store_id id;
    double more;
} rec;

Test(store_live, the_search_finds_ids_and_where_others_go)
{
    rec v[4] = {{1, "b", 0}, {2, "d", 0}, {3, "f", 0}, {4, "h", 0}};
    static const struct {
        const char *id;
        int found, at;
    } cases[] = {{"a", 0, 0}, {"b", 1, 0}, {"c", 0, 1}, {"d", 1, 1}, {"f", 1, 2},
                 {"g", 0, 3}, {"h", 1, 3}, {"i", 0, 4}, {"bb", 0, 1}};
    for (size_t k = 0; k < sizeof cases / sizeof *cases; k++) {
        int at = -1;
        int found = kvp_store_id_search(v, 4, sizeof *v, offsetof(rec, id), cases[k].id, &at);
        cr_assert_eq(found, cases[k].found, "%s", cases[k].id);
        cr_assert_eq(at, cases[k].at, "%s", cases[k].id);
        if (found)
            cr_assert_eq(v[at].other, at + 1);
    }
    int at = -1;
    cr_assert_eq(kvp_store_id_search(NULL, 0, sizeof *v, offsetof(rec, id), "x", &at), 0);
    cr_assert_eq(at, 0, "an empty array: it would go first");
}
