/* Helpers of the offline tests (traceutil.c). */
#ifndef KVP_TESTS_TRACEUTIL_H
#define KVP_TESTS_TRACEUTIL_H

#include "cache/rope.h"
#include "model/model.h"
#include "offline/trace.h"
#include "policy/kvp_agent.h"

/* The synthetic trace: layers, KV heads, query heads per KV head, head_dim, tokens per
 * sequence, sequences and the training ones among them. */
#define T_LAYERS 2
#define T_KVH 2
#define T_GROUP 2
#define T_HEADS (T_KVH * T_GROUP)
#define T_D 4
#define T_LEN 96
#define T_SEQS 8
#define T_TRAIN 6

/* Writes dir/trace.kvpt with episodes at cuts cut_min, cut_min + 8, ..., 88: queries point
 * along one direction per head, so a row's future attention follows its key's projection
 * on it (a ranking an agent can learn from keys). */
void make_trace_grid(const char *dir, int cut_min);
void make_trace(const char *dir);          /* cuts from 32 */
const char *trace_dir(void);               /* this process's trace, made on first use */
void open_trace(kvp_trace *t);
void remove_trace(void);
extern const kvp_agent_arch tiny_arch;     /* agents for the trace's head_dim */
/* The first n rows of agent (layer, kvh) of a sequence decoded to f32, the keys centred on
 * them and, with a rope, turned back by n: what agents with centred (relative) keys see
 * at cut n, computed here without the library's helpers. k, v: [n][T_D]. */
void framed_rows(const kvp_trace *t, int seq, int layer, int kvh, int n, const kvp_rope *rope,
                 float *k, float *v);
/* Tokens of the held-out part of TinyStories' dev text (its last 20%, as kvp eval splits
 * it): the first max_bytes of it, tokenized by m's tokenizer into *ids (malloc'd). */
long heldout_story_ids(const kvp_model *m, size_t max_bytes, int **ids);
/* `kvp SUB ARGS` with stderr in *out; its exit status. */
int run_kvp(const char *sub, const char *args, char **out);

#endif
