/* The prefix index: the longest indexed prefix wins, tenants never see each other's
 * conversations, a removed or evicted conversation is gone, the bounds hold, and empty,
 * short, huge and hostile token lists are harmless. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "store/prefix.h"

#define B KVP_PREFIX_BLOCK

static int A_, B_, C_, D_;   /* owners: only their addresses matter */

static int *seq(int n, int salt)
{
    int *t = malloc((size_t)(n > 0 ? n : 1) * sizeof *t);
    cr_assert_not_null(t);
    for (int i = 0; i < n; i++)
        t[i] = (i * 31 + salt * 7919) % 32000;
    return t;
}

Test(prefix, longest_prefix_wins)
{
    kvp_prefix_index *ix = kvp_prefix_create(0, 0);
    cr_assert_not_null(ix);
    int *sys = seq(200, 1);
    int *a = seq(200, 1), *b = seq(200, 1);
    /* a shares 5 blocks + 3 tokens with the query, b shares 9 blocks + 5 tokens */
    a[83] = -1;
    b[149] = -2;
    cr_assert_eq(kvp_prefix_put(ix, &A_, "t", a, 200), 0);
    cr_assert_eq(kvp_prefix_put(ix, &B_, "t", b, 200), 0);
    cr_assert_eq(kvp_prefix_owner_blocks(ix, &A_), 200 / B);
    int len;
    cr_assert_eq(kvp_prefix_lookup(ix, "t", sys, 200, NULL, NULL, &len), &B_);
    cr_assert_eq(len, 9 * B);
    /* a query that diverges inside block 2 only matches 2 blocks, both owners qualify */
    int *q = seq(200, 1);
    q[40] = -3;
    const void *o = kvp_prefix_lookup(ix, "t", q, 200, NULL, NULL, &len);
    cr_assert(o == &A_ || o == &B_);
    cr_assert_eq(len, 2 * B);
    /* a query shorter than a block never matches */
    cr_assert_null(kvp_prefix_lookup(ix, "t", sys, B - 1, NULL, NULL, &len));
    cr_assert_eq(len, 0);
    /* a query whose first block differs matches nothing */
    q[0] = -4;
    cr_assert_null(kvp_prefix_lookup(ix, "t", q, 200, NULL, NULL, &len));
    cr_assert_eq(len, 0);
    free(q);
    free(a);
    free(b);
    free(sys);
    kvp_prefix_free(ix);
}

static int reject_b(void *ctx, const void *owner)
{
    (*(int *)ctx)++;
    return owner != &B_;
}

Test(prefix, the_filter_picks_among_candidates)
{
    kvp_prefix_index *ix = kvp_prefix_create(0, 0);
    int *a = seq(100, 2), *b = seq(100, 2);
    a[40] = -1;   /* a: 2 blocks in common with the query, b: all 6 */
    kvp_prefix_put(ix, &A_, NULL, a, 100);
    kvp_prefix_put(ix, &B_, NULL, b, 100);
    int len, calls = 0;
    cr_assert_eq(kvp_prefix_lookup(ix, NULL, b, 100, reject_b, &calls, &len), &A_);
    cr_assert_eq(len, 2 * B);
    cr_assert_gt(calls, 0);
    free(a);
    free(b);
    kvp_prefix_free(ix);
}

Test(prefix, tenants_never_match_each_other)
{
    kvp_prefix_index *ix = kvp_prefix_create(0, 0);
    int *t = seq(300, 3);
    kvp_prefix_put(ix, &A_, "alice", t, 300);
    int len;
    cr_assert_null(kvp_prefix_lookup(ix, "bob", t, 300, NULL, NULL, &len));
    cr_assert_eq(len, 0);
    cr_assert_null(kvp_prefix_lookup(ix, NULL, t, 300, NULL, NULL, &len));
    cr_assert_null(kvp_prefix_lookup(ix, "alic", t, 300, NULL, NULL, &len));
    cr_assert_null(kvp_prefix_lookup(ix, "alicee", t, 300, NULL, NULL, &len));
    cr_assert_eq(kvp_prefix_lookup(ix, "alice", t, 300, NULL, NULL, &len), &A_);
    cr_assert_eq(len, 300 / B * B);
    /* the default tenant ("" and NULL are the same one) */
    kvp_prefix_put(ix, &B_, "", t, 300);
    cr_assert_eq(kvp_prefix_lookup(ix, NULL, t, 300, NULL, NULL, &len), &B_);
    cr_assert_eq(kvp_prefix_lookup(ix, "alice", t, 300, NULL, NULL, &len), &A_);
    free(t);
    kvp_prefix_free(ix);
}

Test(prefix, remove_and_replace)
{
    kvp_prefix_index *ix = kvp_prefix_create(0, 0);
    int *t = seq(64, 4), *u = seq(64, 5);
    kvp_prefix_put(ix, &A_, "t", t, 64);
    kvp_prefix_put(ix, &B_, "t", u, 64);
    cr_assert_eq(kvp_prefix_blocks(ix), 8);
    kvp_prefix_remove(ix, &A_);
    kvp_prefix_remove(ix, &A_);     /* twice: harmless */
    kvp_prefix_remove(ix, &C_);     /* never indexed: harmless */
    cr_assert_eq(kvp_prefix_blocks(ix), 4);
    int len;
    cr_assert_null(kvp_prefix_lookup(ix, "t", t, 64, NULL, NULL, &len));
    cr_assert_eq(kvp_prefix_lookup(ix, "t", u, 64, NULL, NULL, &len), &B_);
    /* a put replaces: B now holds t's tokens, u's are gone */
    kvp_prefix_put(ix, &B_, "t", t, 32);
    cr_assert_eq(kvp_prefix_blocks(ix), 2);
    cr_assert_null(kvp_prefix_lookup(ix, "t", u, 64, NULL, NULL, &len));
    cr_assert_eq(kvp_prefix_lookup(ix, "t", t, 64, NULL, NULL, &len), &B_);
    cr_assert_eq(len, 32);
    /* putting too few tokens removes */
    kvp_prefix_put(ix, &B_, "t", t, B - 1);
    cr_assert_eq(kvp_prefix_blocks(ix), 0);
    cr_assert_eq(kvp_prefix_owner_blocks(ix, &B_), 0);
    free(t);
    free(u);
    kvp_prefix_free(ix);
}

Test(prefix, the_total_bound_evicts_the_least_recently_used)
{
    kvp_prefix_index *ix = kvp_prefix_create(8, 20);
    int *a = seq(8 * B, 6), *b = seq(8 * B, 7), *c = seq(8 * B, 8);
    kvp_prefix_put(ix, &A_, "t", a, 8 * B);
    kvp_prefix_put(ix, &B_, "t", b, 8 * B);
    int len;
    cr_assert_eq(kvp_prefix_lookup(ix, "t", a, 8 * B, NULL, NULL, &len), &A_);   /* A used */
    kvp_prefix_put(ix, &C_, "t", c, 8 * B);   /* 24 > 20: B, the least recent, goes */
    cr_assert_eq(kvp_prefix_evictions(ix), 1);
    cr_assert_leq(kvp_prefix_blocks(ix), 20);
    cr_assert_null(kvp_prefix_lookup(ix, "t", b, 8 * B, NULL, NULL, &len));
    cr_assert_eq(kvp_prefix_lookup(ix, "t", a, 8 * B, NULL, NULL, &len), &A_);
    cr_assert_eq(kvp_prefix_lookup(ix, "t", c, 8 * B, NULL, NULL, &len), &C_);
    free(a);
    free(b);
    free(c);
    kvp_prefix_free(ix);
}

Test(prefix, the_per_conversation_bound_and_bytes)
{
    kvp_prefix_index *ix = kvp_prefix_create(0, 0);
    int n = (KVP_PREFIX_MAX_PER + 100) * B;
    int *t = seq(n, 9);
    cr_assert_eq(kvp_prefix_put(ix, &A_, "t", t, n), 0);
    cr_assert_eq(kvp_prefix_owner_blocks(ix, &A_), KVP_PREFIX_MAX_PER);
    int len;
    cr_assert_eq(kvp_prefix_lookup(ix, "t", t, n, NULL, NULL, &len), &A_);
    cr_assert_eq(len, KVP_PREFIX_MAX_PER * B);
    size_t bytes = kvp_prefix_bytes(ix);
    cr_assert_leq(bytes, (size_t)KVP_PREFIX_MAX_PER * KVP_PREFIX_ENTRY_BYTES + 4096,
                  "%zu bytes for one conversation at the cap", bytes);
    cr_assert_geq(bytes, (size_t)KVP_PREFIX_MAX_PER * 28);
    free(t);
    kvp_prefix_free(ix);
}

Test(prefix, many_conversations_stay_within_the_total)
{
    kvp_prefix_index *ix = kvp_prefix_create(64, 1000);
    static int owners[100];
    int *t = seq(64 * B, 10);
    for (int i = 0; i < 100; i++) {
        t[0] = i;   /* distinct first blocks */
        cr_assert_eq(kvp_prefix_put(ix, &owners[i], "t", t, 64 * B), 0);
        cr_assert_leq(kvp_prefix_blocks(ix), 1000);
    }
    cr_assert_eq(kvp_prefix_blocks(ix), 15 * 64);
    cr_assert_leq(kvp_prefix_bytes(ix), (size_t)1000 * KVP_PREFIX_ENTRY_BYTES + 100 * 64 + 4096);
    int len;
    cr_assert_eq(kvp_prefix_lookup(ix, "t", t, 64 * B, NULL, NULL, &len), &owners[99]);
    t[0] = 0;
    cr_assert_null(kvp_prefix_lookup(ix, "t", t, 64 * B, NULL, NULL, &len));
    free(t);
    kvp_prefix_free(ix);
}

Test(prefix, hostile_inputs)
{
    kvp_prefix_index *ix = kvp_prefix_create(0, 0);
    int len = 7;
    int one = 5;
    /* empty, negative, NULL token lists */
    cr_assert_eq(kvp_prefix_put(ix, &A_, "t", NULL, 0), 0);
    cr_assert_eq(kvp_prefix_put(ix, &A_, "t", &one, -5), 0);
    cr_assert_eq(kvp_prefix_put(ix, &A_, "t", NULL, 1000), 0);
    cr_assert_eq(kvp_prefix_blocks(ix), 0);
    cr_assert_null(kvp_prefix_lookup(ix, "t", NULL, 0, NULL, NULL, &len));
    cr_assert_eq(len, 0);
    cr_assert_null(kvp_prefix_lookup(ix, "t", &one, -1, NULL, NULL, &len));
    cr_assert_eq(kvp_prefix_put(ix, NULL, "t", &one, 1), -EINVAL);
    cr_assert_eq(kvp_prefix_put(NULL, &A_, "t", &one, 1), -EINVAL);
    cr_assert_null(kvp_prefix_lookup(NULL, "t", &one, 1, NULL, NULL, &len));
    /* a huge query against a small index: only the capped blocks are hashed */
    int n = 4 * 1024 * 1024;
    int *huge = seq(n, 11);
    cr_assert_eq(kvp_prefix_put(ix, &A_, "t", huge, 64), 0);
    cr_assert_eq(kvp_prefix_lookup(ix, "t", huge, n, NULL, NULL, &len), &A_);
    cr_assert_eq(len, 64);
    /* extreme token values and a tenant with odd bytes */
    for (int i = 0; i < 64; i++)
        huge[i] = i % 2 ? INT32_MIN : INT32_MAX;
    cr_assert_eq(kvp_prefix_put(ix, &B_, "\xff\x01 tenant\n", huge, 64), 0);
    cr_assert_eq(kvp_prefix_lookup(ix, "\xff\x01 tenant\n", huge, 64, NULL, NULL, &len), &B_);
    cr_assert_null(kvp_prefix_lookup(ix, "t", huge, 64, NULL, NULL, &len));
    (void)D_;
    kvp_prefix_free(ix);
    kvp_prefix_remove(NULL, &A_);
    kvp_prefix_free(NULL);
    free(huge);
}

Test(prefix, an_owners_chain_moves_to_another_index)
{
    kvp_prefix_index *a = kvp_prefix_create(0, 0), *b = kvp_prefix_create(0, 0);
    cr_assert(a && b);
    int *t = seq(100, 7);   /* 6 whole blocks */
    cr_assert_eq(kvp_prefix_put(a, &A_, "k1", t, 100), 0);
    uint64_t got[8], want[8];
    cr_assert_eq(kvp_prefix_owner_chain(a, &A_, got, 8), 6);
    cr_assert_eq(kvp_prefix_chain("k1", t, 100, want, 8), 6);
    cr_assert_eq(memcmp(got, want, sizeof got[0] * 6), 0, "the chain is not the one put");
    cr_assert_eq(kvp_prefix_owner_chain(a, &A_, got, 2), 2, "max is not kept");
    cr_assert_eq(kvp_prefix_owner_chain(a, &B_, got, 8), 0, "an unknown owner has a chain");
    /* put under another owner in b, it answers the same lookups, for its tenant only */
    cr_assert_eq(kvp_prefix_put_chain(b, &B_, "k1", want, 6), 0);
    int len = 0;
    cr_assert_eq(kvp_prefix_lookup(b, "k1", t, 100, NULL, NULL, &len), &B_);
    cr_assert_eq(len, 96);
    cr_assert_null(kvp_prefix_lookup(b, "k2", t, 100, NULL, NULL, &len));
    kvp_prefix_free(a);
    kvp_prefix_free(b);
    free(t);
}
