#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/fileio.h"

static char g_dir[64];

static void make_dir(void)
{
    snprintf(g_dir, sizeof g_dir, "/tmp/kvp-fileio-XXXXXX");
    cr_assert(mkdtemp(g_dir));
}

static void remove_dir(void)
{
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", g_dir);
    cr_assert_eq(system(cmd), 0);
}

static void path_in(char *buf, size_t n, const char *name)
{
    snprintf(buf, n, "%s/%s", g_dir, name);
}

TestSuite(fileio, .init = make_dir, .fini = remove_dir);

/* What is written comes back byte for byte; a read past the end stops at the end. */
Test(fileio, write_all_then_read_full_round_trip_and_short_file)
{
    char path[128];
    path_in(path, sizeof path, "data");
    struct stat st;
    int fd = kvp_open_regular(path, O_WRONLY | O_CREAT | O_TRUNC, &st);
    cr_assert_geq(fd, 0, "create: %s", strerror(-fd));
    size_t n = 1 << 20;   /* larger than a pipe or a single write is guaranteed to take */
    unsigned char *out = malloc(n), *in = malloc(n + 100);
    for (size_t i = 0; i < n; i++)
        out[i] = (unsigned char)(i * 2654435761u >> 13);
    cr_assert_eq(kvp_write_all(fd, out, n), 0);
    close(fd);
    fd = kvp_open_regular(path, O_RDONLY, &st);
    cr_assert_geq(fd, 0);
    cr_assert_eq((size_t)st.st_size, n, "fstat fills the size");
    cr_assert_eq(kvp_read_full(fd, in, n + 100), (long long)n, "stops at the end of the file");
    cr_assert_eq(memcmp(in, out, n), 0);
    cr_assert_eq(kvp_read_full(fd, in, 10), 0, "nothing left");
    close(fd);
    free(out);
    free(in);
}

Test(fileio, open_regular_refuses_links_fifos_directories_and_missing_files)
{
    char file[128], link[128], fifo[128], missing[128];
    path_in(file, sizeof file, "file");
    path_in(link, sizeof link, "link");
    path_in(fifo, sizeof fifo, "fifo");
    path_in(missing, sizeof missing, "missing");
    struct stat st;
    int fd = kvp_open_regular(file, O_WRONLY | O_CREAT, &st);
    cr_assert_geq(fd, 0);
    close(fd);
    cr_assert_eq(symlink(file, link), 0);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    cr_assert_eq(kvp_open_regular(link, O_RDONLY, &st), -ELOOP, "a symbolic link is not followed");
    /* A FIFO with no writer would block a plain open for reading: this one returns. */
    cr_assert_eq(kvp_open_regular(fifo, O_RDONLY, &st), KVP_E_NOT_REGULAR);
    cr_assert_eq(kvp_open_regular(fifo, O_WRONLY, &st), -ENXIO, "no reader: refused, not blocked");
    cr_assert_eq(kvp_open_regular(g_dir, O_RDONLY, &st), KVP_E_NOT_REGULAR);
    cr_assert_eq(kvp_open_regular(missing, O_RDONLY, &st), -ENOENT);
    /* no descriptor is left open by the refusals: the next open gets the lowest free one */
    int probe = open("/dev/null", O_RDONLY);
    fd = kvp_open_regular(file, O_RDONLY, &st);
    cr_assert_eq(fd, probe + 1);
    close(fd);
    close(probe);
}

Test(fileio, write_all_reports_the_error)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    close(p[0]);   /* no reader: EPIPE (SIGPIPE ignored for the test) */
    signal(SIGPIPE, SIG_IGN);
    cr_assert_eq(kvp_write_all(p[1], "x", 1), -EPIPE);
    close(p[1]);
    cr_assert_eq(kvp_write_all(p[1], "x", 1), -EBADF);
    char c;
    cr_assert_eq(kvp_read_full(p[1], &c, 1), -EBADF);
}

/* Input files (model, policy, config) may be links, never FIFOs: a FIFO with no writer
 * returns at once instead of blocking; what is returned reads in blocking mode. */
Test(fileio, open_input_follows_links_and_refuses_fifos_without_blocking)
{
    char file[128], link[128], fifo[128];
    path_in(file, sizeof file, "in");
    path_in(link, sizeof link, "in-link");
    path_in(fifo, sizeof fifo, "in-fifo");
    struct stat st;
    int fd = kvp_open_regular(file, O_WRONLY | O_CREAT, &st);
    cr_assert_geq(fd, 0);
    cr_assert_eq(kvp_write_all(fd, "abc", 3), 0);
    close(fd);
    cr_assert_eq(symlink(file, link), 0);
    cr_assert_eq(mkfifo(fifo, 0600), 0);
    fd = kvp_open_input(link, &st);
    cr_assert_geq(fd, 0, "a link is followed: %s", kvp_fileio_strerror(fd));
    cr_assert_eq(st.st_size, 3);
    cr_assert_eq(fcntl(fd, F_GETFL) & O_NONBLOCK, 0, "blocking again");
    close(fd);
    cr_assert_eq(kvp_open_input(fifo, &st), KVP_E_NOT_REGULAR);
    cr_assert_eq(kvp_open_input(g_dir, &st), KVP_E_NOT_REGULAR);
    cr_assert(strstr(kvp_fileio_strerror(KVP_E_NOT_REGULAR), "not a regular file"));
    FILE *f = kvp_fopen_input(fifo);
    cr_assert_null(f);
    cr_assert_eq(errno, EINVAL);
    f = kvp_fopen_input(link);
    cr_assert(f);
    char buf[4] = {0};
    cr_assert_eq(fread(buf, 1, 3, f), 3);
    cr_assert_str_eq(buf, "abc");
    fclose(f);
}
