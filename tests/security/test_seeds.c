/* Sampler seeds against the daemon, as two tenants would probe them: the same prompt at
 * temperature 1 with no seed gets different replies (every session draws its own seed
 * from the CSPRNG, so one reply predicts nothing about the next, from either key), and a
 * request's own `seed` makes its reply reproducible without reading or shifting any
 * other request's random stream. */
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tests/daemon/harness.h"
#include "tests/security/seclib.h"

TestSuite(security_seeds, .timeout = 120);

#define KA "Authorization: Bearer key-a\r\n"
#define KB "Authorization: Bearer key-b\r\n"

/* The reply to "Once upon a time" at temperature 1 (24 tokens), with seed when it is
 * not negative; a 200 with a non-empty reply is asserted. */
static void reply_to(const kvpd_proc *p, const char *key, long seed, char *out, size_t n)
{
    char body[256], s[48] = "";
    if (seed >= 0)
        snprintf(s, sizeof s, ",\"seed\":%ld", seed);
    snprintf(body, sizeof body,
             "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],"
             "\"temperature\":1,\"max_tokens\":24%s}", s);
    sec_answer a = sec_post(p, key, body);
    cr_assert_eq(a.status, 200, "%s (log %s)", a.raw, p->log);
    cr_assert(a.reply[0], "an empty reply: %s", a.raw);
    snprintf(out, n, "%s", a.reply);
    sec_answer_free(&a);
}

Test(security_seeds, unseeded_replies_differ_across_sessions_and_keys)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key key-a,key-b"), 0, "log %s", d.log);
    /* Eight replies of 24 tokens sampled from a 512-token vocabulary, alternating keys.
     * With independent seeds two of them are now and then equal (the model is peaked),
     * three or more pairs practically never; a shared or constant seed repeats them (a
     * constant one gives both keys the same stream: at most 4 distinct), so at least 5
     * distinct tells them apart without flaking. */
    enum { N = 8 };
    char r[N][512];
    for (int i = 0; i < N; i++)
        reply_to(&d, i % 2 ? KB : KA, -1, r[i], sizeof r[i]);
    int distinct = 0;
    for (int i = 0; i < N; i++) {
        int seen = 0;
        for (int j = 0; j < i && !seen; j++)
            seen = !strcmp(r[i], r[j]);
        distinct += !seen;
    }
    cr_assert_geq(distinct, 5, "only %d distinct replies of %d; the first: \"%s\", the second: "
                  "\"%s\"", distinct, N, r[0], r[1]);
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}

Test(security_seeds, a_seed_reproduces_its_own_reply_and_nothing_shifts_it)
{
    kvpd_proc d;
    cr_assert_eq(kvpd_start(&d, "--api-key key-a,key-b"), 0, "log %s", d.log);
    char a1[512], a2[512], b[512], other[512], noise[512];
    reply_to(&d, KA, 12345, a1, sizeof a1);
    /* Key B's unseeded requests in between do not move key A's seeded stream. */
    for (int i = 0; i < 3; i++)
        reply_to(&d, KB, -1, noise, sizeof noise);
    reply_to(&d, KA, 12345, a2, sizeof a2);
    cr_assert_str_eq(a2, a1, "the same seed gave another reply after another tenant's "
                     "requests");
    /* The seed is the request's, not a tenant's: key B naming it gets the same text (and
     * learns nothing about key A's unseeded sessions by it). */
    reply_to(&d, KB, 12345, b, sizeof b);
    cr_assert_str_eq(b, a1, "the same seed from another key gave another reply");
    /* The seed decides the reply: another seed gives another one. */
    reply_to(&d, KA, 54321, other, sizeof other);
    cr_assert_str_neq(other, a1, "two seeds gave the same reply");
    reply_to(&d, KA, 12345, a2, sizeof a2);
    cr_assert_str_eq(a2, a1, "the seed no longer reproduces its reply");
    cr_assert_eq(kvpd_stop(&d, 10000), 0);
}
