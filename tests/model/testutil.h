/* Shared test helpers: paths to ../shared and the build, file slurping. */
#ifndef KVP_TESTUTIL_H
#define KVP_TESTUTIL_H

#include <stddef.h>
#include <stdint.h>

/* "$KVP_SHARED/<rel>" (falls back to ../shared relative to the source root). */
const char *tu_shared(const char *rel);
/* "$KVP_BUILD/<rel>" */
const char *tu_build(const char *rel);
/* 1 when doc is a whole document of the grammar g (model/grammar.h), else 0. */
struct kvp_grammar;
int tu_grammar_whole(struct kvp_grammar *g, const char *doc);
/* Reads a whole file (malloc'd, NUL-terminated); aborts the test on failure. */
char *tu_slurp(const char *path, size_t *len);
/* Writes len bytes to a fresh temp file; returns its path (static buffer rotation of 4).
 * The file is removed when the test process exits (tu_remove_tmp_files). */
const char *tu_write_tmp(const void *buf, size_t len);
/* Removes every file tu_write_tmp made in this process (registered with atexit). */
void tu_remove_tmp_files(void);
/* Runs a shell command, captures stdout into *out (malloc'd), returns the exit status
 * (or -1 if it did not exit normally, e.g. a crash). */
int tu_run(const char *cmd, char **out);

/* w written by kvp_gguf_writer_write into a heap buffer (free it), with the given tensor
 * fill callback; a failed write fails the test. */
struct kvp_gguf_writer;
uint8_t *tu_gguf_to_mem(struct kvp_gguf_writer *w,
                        int (*fill)(void *, uint64_t, void *, uint64_t), size_t *len);
/* A tensor fill callback for tu_gguf_to_mem: byte j of tensor i is (j * 7 + i * 31 + 1)
 * mod 256, so every tensor's data differs from its neighbours'. */
int tu_gguf_fill_pattern(void *ctx, uint64_t i, void *buf, uint64_t n);

#endif
