/* The token streams the offline tools learn and evaluate on (kvp trace, kvp eval, kvp
 * learn): plain text, or chat conversations rendered with the model's own template. */
#ifndef KVP_TOOLS_CORPUS_H
#define KVP_TOOLS_CORPUS_H

#include <stddef.h>
#include "model/model.h"

/* A text file's bytes (malloc'd, NUL after them; *len: how many), or NULL with errno set
 * when it cannot be read. */
char *kvp_corpus_read(const char *path, size_t *len);

/* Tokens of text[from..to) (a part of the file `path`, for messages). Plain text is
 * tokenized line by line (kvp_trace_tokenize). With conversations, each line is a JSON
 * object {"messages": [{"role": "system"|"user"|"assistant", "content": TEXT}, ...]}
 * (a system message only first; OpenAI's shape) rendered by kvp_template_render with the
 * model's chat template, special tokens included, the conversations one after the
 * other. *out is malloc'd. Returns the count, or -1 with a message (the file's line for
 * a line that is not a conversation). */
/* conversations = KVP_CORPUS_IDS: each line is a transcript's token ids in decimal,
 * separated by spaces (what kvp learn --transcripts writes), the lines one after the
 * other; an id outside the vocabulary is an error naming its line. */
#define KVP_CORPUS_IDS 2
long kvp_corpus_tokens(const kvp_model *m, const char *path, const char *text, size_t from,
                       size_t to, int conversations, int **out, char *err, size_t errlen);
/* The chat format conversations are rendered with ("chatml", "llama3", ... "plain"). */
const char *kvp_corpus_format(const kvp_model *m);

/* Sequences of len tokens cut one after the other from a token stream, as kvp trace and
 * kvp eval make them: BOS then len - 1 tokens of the stream, or len tokens of it for a
 * model without BOS (bos < 0). How many fit in n_ids tokens, and the i-th into out[len]. */
long kvp_corpus_count(long n_ids, long len, int bos);
void kvp_corpus_sequence(const int *ids, long i, long len, int bos, int *out);

#endif
