/* tests/model/testutil: the temporary files of tu_write_tmp do not outlive the test. */
#include <criterion/criterion.h>
#include <errno.h>
#include <stdio.h>
#include <unistd.h>

#include "tests/model/testutil.h"

Test(testutil, write_tmp_files_are_removed)
{
    char a[64], b[64];
    snprintf(a, sizeof a, "%s", tu_write_tmp("one", 3));
    snprintf(b, sizeof b, "%s", tu_write_tmp("two", 3));
    cr_assert_str_neq(a, b);
    cr_assert_eq(access(a, F_OK), 0, "%s was not written", a);
    cr_assert_eq(access(b, F_OK), 0, "%s was not written", b);
    tu_remove_tmp_files();   /* what atexit runs when the test process ends */
    cr_assert(access(a, F_OK) < 0 && errno == ENOENT, "%s is still there", a);
    cr_assert(access(b, F_OK) < 0 && errno == ENOENT, "%s is still there", b);
    /* files made after a removal are tracked again */
    snprintf(a, sizeof a, "%s", tu_write_tmp("three", 5));
    tu_remove_tmp_files();
    cr_assert(access(a, F_OK) < 0 && errno == ENOENT, "%s is still there", a);
}
