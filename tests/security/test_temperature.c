/* Against the daemon: a temperature of 1e-40, in a message or in the
 * config, must not make the sampler read out of bounds (ASan would abort the daemon;
 * a release build would answer <unk> forever). Tiny temperatures are greedy: the reply is the
 * temperature-0 reply. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/daemon/harness.h"

TestSuite(security_temperature, .timeout = 90);

static const char *str_of(json_t *j, const char *key)
{
    return json_string_value(json_object_get(j, key));
}

/* The reply to one message on a new session; temperature NULL: the config's. */
static char *reply_to(const kvpd_proc *p, const char *temperature)
{
    ws_client c;
    cr_assert_eq(h_connect(p, &c), 0);
    char msg[256];
    snprintf(msg, sizeof msg, "{\"type\":\"message\",\"text\":\"Once upon a time\","
             "\"max_tokens\":24%s%s}", temperature ? ",\"temperature\":" : "",
             temperature ? temperature : "");
    cr_assert_eq(ws_send_text(&c, msg), 0);
    json_t *done = h_expect(&c, "done", 20000);
    cr_assert(done, "no done (log %s)", p->log);
    char *r = strdup(str_of(done, "reply"));
    json_decref(done);
    ws_close(&c);
    return r;
}

Test(security_temperature, tiny_temperatures_are_greedy)
{
    kvpd_proc p;
    cr_assert_eq(kvpd_start(&p, ""), 0, "log %s", p.log);
    char *greedy = reply_to(&p, "0");
    cr_assert_gt(strlen(greedy), 0);
    cr_expect(!strstr(greedy, "<unk>"), "%s", greedy);
    const char *tiny[] = {"1e-40", "1e-30", "1e-8"};
    for (int i = 0; i < 3; i++) {
        char *r = reply_to(&p, tiny[i]);
        cr_expect_str_eq(r, greedy, "temperature %s", tiny[i]);
        free(r);
    }
    cr_expect_eq(kvpd_stop(&p, 10000), 0);

    cr_assert_eq(kvpd_start(&p, "--temperature 1e-40 --top-p 0.9"), 0, "log %s", p.log);
    char *r = reply_to(&p, NULL);
    cr_expect_str_eq(r, greedy, "config temperature 1e-40");
    free(r);
    free(greedy);
    cr_expect_eq(kvpd_stop(&p, 10000), 0);
}
