/* Stored responses through the hub (kvp_hub_response_*, sessions/hub_resp.c): each call is
 * answered by one RESPONSE event on the loop, after the store's I/O on the hub's thread
 * (counted as a job until then); records stay with their tenant and within the bounds of
 * the live config; a malformed id is answered without the store; a client that closes
 * before its answer gets none, and its write still lands. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tests/model/testutil.h"
#include "tests/sessions/hubtest.h"

static ht_hub g;
static ht_client a, b;
static char g_dir[64];

TestSuite(hub_resp, .timeout = 60);

static void finish(void)
{
    ht_client *all[] = {&a, &b};
    ht_finish(&g, all, sizeof all / sizeof all[0]);
    if (g_dir[0]) {
        char cmd[128];
        snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
        cr_assert_eq(system(cmd), 0);
        g_dir[0] = 0;
    }
}

static void start(int with_dir)
{
    if (with_dir) {
        snprintf(g_dir, sizeof g_dir, "/tmp/kvp-hubresp-XXXXXX");
        cr_assert(mkdtemp(g_dir));
    }
    ht_start(&g, with_dir ? g_dir : NULL, "streaming");
    g.cfg.max_stored_responses_per_tenant = 1024;
    ht_client_new(&g, &a);
    ht_client_new(&g, &b);
    kvp_hub_client_set_tenant(a.c, "00000000000000aa");
    kvp_hub_client_set_tenant(b.c, "00000000000000bb");
}

static void id_of(char *id, int k)
{
    snprintf(id, 40, "resp_%024x", k);
}

/* Runs the loop until c's next RESPONSE event: its index. */
static int answer(ht_client *c)
{
    return ht_wait(&g, c, c->n, KVP_HUB_RESPONSE, 10);
}

static int put(ht_client *c, const char *id, const char *payload)
{
    int from = c->n;
    kvp_hub_response_put(c->c, id, payload, strlen(payload));
    return c->ev[ht_wait(&g, c, from, KVP_HUB_RESPONSE, 10)].resp_rc;
}

/* get: the event's index. */
static int get(ht_client *c, const char *id)
{
    int from = c->n;
    kvp_hub_response_get(c->c, id);
    return ht_wait(&g, c, from, KVP_HUB_RESPONSE, 10);
}

static void round_trip(void)
{
    char id[40];
    id_of(id, 1);
    kvp_hub_response_put(a.c, id, "{\"a\":1}", 7);
    cr_expect_geq(kvp_hub_jobs(g.hub), 1, "a pending write is no job for the drain");
    cr_expect_eq(a.n, 0, "answered before the store's thread ran");
    int i = answer(&a);
    cr_expect_eq(a.ev[i].resp_rc, 0, "%s", a.ev[i].text);
    cr_expect_str_eq(a.ev[i].id, id);
    cr_expect_eq(kvp_hub_jobs(g.hub), 0);
    i = get(&a, id);
    cr_assert_eq(a.ev[i].resp_rc, 0);
    cr_expect_str_eq(a.ev[i].text, "{\"a\":1}");
    i = get(&b, id);
    cr_expect_eq(b.ev[i].resp_rc, -ENOENT, "another tenant's record was given");
    kvp_hub_response_delete(b.c, id);
    cr_expect_eq(b.ev[answer(&b)].resp_rc, -ENOENT);
    kvp_hub_response_delete(a.c, id);
    cr_expect_eq(a.ev[answer(&a)].resp_rc, 0);
    cr_expect_eq(a.ev[get(&a, id)].resp_rc, -ENOENT);
}

Test(hub_resp, in_memory_a_record_goes_to_its_tenant_only, .fini = finish)
{
    start(0);
    round_trip();
}

Test(hub_resp, in_the_state_directory_likewise, .fini = finish)
{
    start(1);
    round_trip();
    char id[40], path[128];
    id_of(id, 2);
    cr_assert_eq(put(&a, id, "{}"), 0);
    snprintf(path, sizeof path, "%s/responses/%s.resp", g_dir, id);
    cr_expect_eq(access(path, F_OK), 0, "no record file once the write was answered");
}

Test(hub_resp, the_bounds_of_the_live_config_apply, .fini = finish)
{
    start(0);
    g.cfg.max_stored_responses_per_tenant = 2;
    char id[3][40];
    for (int i = 0; i < 3; i++) {
        id_of(id[i], i);
        cr_assert_eq(put(&a, id[i], "{}"), 0);
    }
    cr_expect_eq(a.ev[get(&a, id[0])].resp_rc, -ENOENT, "the oldest stayed past the bound");
    cr_expect_eq(a.ev[get(&a, id[2])].resp_rc, 0);
}

Test(hub_resp, a_malformed_id_is_answered_without_the_store, .fini = finish)
{
    start(1);
    static const char *const bad[] = {"../../x", "resp_", "resp_0000000000000000000000001",
                                      "resp_00000000000000000000000/"};
    for (size_t k = 0; k < sizeof bad / sizeof *bad; k++) {
        int i = get(&a, bad[k]);
        cr_expect_eq(a.ev[i].resp_rc, -EINVAL, "%s", bad[k]);
        cr_expect(strstr(a.ev[i].text, "not a response id"), "%s", a.ev[i].text);
        cr_expect_eq(put(&a, bad[k], "{}"), -EINVAL, "%s was written", bad[k]);
    }
    char dir[128];
    snprintf(dir, sizeof dir, "%s/responses", g_dir);
    cr_expect_neq(access(dir, F_OK), 0, "a malformed id made the records' folder");
}

Test(hub_resp, a_client_closed_before_its_answer_gets_none_and_its_write_lands, .fini = finish)
{
    start(0);
    char id[40];
    id_of(id, 7);
    kvp_hub_response_put(a.c, id, "{\"k\":1}", 7);
    kvp_hub_response_get(a.c, id);
    kvp_hub_close(a.c);   /* its sink's memory stays: an event would land in a.ev */
    a.c = NULL;
    ht_settle(&g);
    cr_expect_eq(kvp_hub_jobs(g.hub), 0);
    cr_expect_eq(a.n, 0, "a closed client got %d event(s)", a.n);
    ht_client_new(&g, &a);
    kvp_hub_client_set_tenant(a.c, "00000000000000aa");
    int i = get(&a, id);
    cr_assert_eq(a.ev[i].resp_rc, 0, "the closed client's write was lost");
    cr_expect_str_eq(a.ev[i].text, "{\"k\":1}");
}
