/* Runs a fuzz target's entry point once per file of the corpus folders given (and on
 * an empty input), as the suite's regression test of what the fuzzers found. */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/fileio.h"
#include "tests/fuzz/fuzz.h"

static int run_file(const char *path)
{
    struct stat st;
    int fd = kvp_open_regular(path, O_RDONLY, &st);
    if (fd < 0) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(-fd));
        return -1;
    }
    size_t n = (size_t)st.st_size;
    unsigned char *buf = malloc(n ? n : 1);
    long long got = buf ? kvp_read_full(fd, buf, n) : -ENOMEM;
    close(fd);
    if (got != (long long)n) {
        fprintf(stderr, "replay: %s: %s\n", path, got < 0 ? strerror((int)-got) : "short read");
        free(buf);
        return -1;
    }
    LLVMFuzzerTestOneInput(buf, n);
    free(buf);
    return 0;
}

int main(int argc, char **argv)
{
    int files = 0;
    LLVMFuzzerTestOneInput((const uint8_t *)"", 0);
    for (int i = 1; i < argc; i++) {
        DIR *d = opendir(argv[i]);
        if (!d) {
            fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
            return 1;
        }
        for (struct dirent *e; (e = readdir(d));) {
            if (e->d_name[0] == '.')
                continue;
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", argv[i], e->d_name);
            if (run_file(path) < 0) {
                closedir(d);
                return 1;
            }
            files++;
        }
        closedir(d);
    }
    if (files == 0) {
        fprintf(stderr, "replay: no corpus files\n");
        return 1;
    }
    printf("replay: %d inputs, no crash\n", files);
    return 0;
}
