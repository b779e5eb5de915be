/* A fresh temporary directory for each test of a suite, for the tests of files kept in a
 * directory (the state directory's hint files, transcript files):
 *
 *     KVP_TEST_DIR_SUITE(suite, var, "tag");
 *
 * declares `static char var[64]`, made before each test (mkdtemp of /tmp/kvp-tag-XXXXXX)
 * and removed with what it holds after it, and the Criterion suite `suite` doing both. */
#ifndef KVP_TESTS_TESTDIR_H
#define KVP_TESTS_TESTDIR_H

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>

#define KVP_TEST_DIR_SUITE(suite, var, tag)                                                \
    static char var[64];                                                                   \
    static void suite##_make_dir(void)                                                     \
    {                                                                                      \
        snprintf(var, sizeof var, "/tmp/kvp-" tag "-XXXXXX");                              \
        cr_assert(mkdtemp(var));                                                           \
    }                                                                                      \
    static void suite##_remove_dir(void)                                                   \
    {                                                                                      \
        char cmd[128];                                                                     \
        snprintf(cmd, sizeof cmd, "rm -rf %s", var);                                       \
        cr_assert_eq(system(cmd), 0);                                                      \
    }                                                                                      \
    TestSuite(suite, .init = suite##_make_dir, .fini = suite##_remove_dir)

#endif
