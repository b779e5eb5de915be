/* Token transcript files: a conversation's token ids with a checksum, as kvpd keeps
 * them in learn_dir (observe/learnlog.h) and kvp learn --transcripts reads them.
 *
 * File (little endian): "KVPTX1\0\0", u64 model fingerprint, u32 token count n, u32 0,
 * u64 FNV-1a of the n u32 token ids as stored, then the n ids. */
#ifndef KVP_TOKFILE_H
#define KVP_TOKFILE_H

#include <stddef.h>
#include <stdint.h>

#define KVP_TOKFILE_EXT ".kvtx"   /* the files' name ending */
#define KVP_TOKFILE_HEADER 32
/* The most tokens a file may hold (a reader refuses more). */
#define KVP_TOKFILE_MAX_TOKENS (1 << 24)

/* The file's bytes for tokens[0..n) (malloc'd, KVP_TOKFILE_HEADER + 4 n long); NULL
 * when out of memory. */
unsigned char *kvp_tokfile_encode(const int *tokens, int n, uint64_t fingerprint, size_t *len);
/* Reads a file: the ids (malloc'd) and the model's fingerprint. -EBADMSG when it is
 * damaged (bad magic, short, wrong checksum, ids out of [0, vocab) when vocab > 0), other
 * negative errnos when it cannot be read; with a message naming the file. */
int kvp_tokfile_read(const char *path, int vocab, int **tokens, int *n, uint64_t *fingerprint,
                     char *err, size_t errlen);

#endif
