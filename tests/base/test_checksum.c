#include <criterion/criterion.h>

#include "base/checksum.h"

/* Known FNV-1a 64 values (the published test vectors), so files kvpd writes can be
 * checked by any standard implementation. */
Test(checksum, fnv1a_64_test_vectors)
{
    cr_expect_eq(kvp_fnv1a(KVP_FNV1A_INIT, "", 0), 0xcbf29ce484222325ull);
    cr_expect_eq(kvp_fnv1a(KVP_FNV1A_INIT, "a", 1), 0xaf63dc4c8601ec8cull);
    cr_expect_eq(kvp_fnv1a(KVP_FNV1A_INIT, "foobar", 6), 0x85944171f73967e8ull);
    /* incremental equals one shot */
    cr_expect_eq(kvp_fnv1a(kvp_fnv1a(KVP_FNV1A_INIT, "foo", 3), "bar", 3), 0x85944171f73967e8ull);
}
