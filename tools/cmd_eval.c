/* kvp eval: every policy at every budget, on held-out text (three protocols) or on chat
 * prompts (the replies protocol) (offline/eval.h, docs/evaluation.md). */
#include <cblas.h>
#include <errno.h>
#include <getopt.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "offline/conv.h"
#include "offline/eval.h"
#include "offline/oracle.h"
#include "offline/pool.h"
#include "offline/trace.h"
#include "tools/cli.h"
#include "tools/stages.h"
#include "tools/corpus.h"
#include "base/parse.h"
#include "base/clock.h"
#include "base/utf8.h"
#include "generate/generate.h"
#include "model/template.h"

#define MAX_POLICIES 16
#define DEFAULT_BUDGETS "16,32,64,128,256"

static void usage(FILE *f)
{
    fprintf(f,
        "usage: kvp eval --model M (--text FILE | --conversations FILE | --prompts FILE)\n"
        "                --out DIR [options]\n"
        "  --conversations F  JSON-lines conversations rendered with the model's chat\n"
        "                     template, as kvp trace reads them\n"
        "  --prompts F        one user message a line (empty lines skipped), each a\n"
        "                     conversation's first turn: the replies protocol alone\n"
        "  --max-prompts N    replies: the first N prompts only (default: all)\n"
        "  --reply-len N      replies: tokens a reply draws at most (default 256)\n"
        "  --dialogs N        the conversation protocol alone, on N conversations of the\n"
        "                     held-out text: 7 user turns of a story, a greedy reply after\n"
        "                     each, turns 4 and 8 asking for turn 1 again\n"
        "  --turn-len N       conversation: story tokens per user turn (default 40)\n"
        "  --turn-reply N     conversation: tokens each reply draws (default 24)\n"
        "  --protect-turns    conversation: every policy also as P+protect, the rows a\n"
        "                     turn's end kept ranking above newer rows (per_head only)\n"
        "  --tokenizer PATH   tokenizer for llama2.c checkpoints\n"
        "  --policies LIST    comma-separated, from: %s\n"
        "                     (default: all of them; kvp only with --policy-file, kvzap\n"
        "                     only with --kvzap-file)\n"
        "  --policy-file F    KVP policy file (for kvp)\n"
        "  --kvzap-file F     KVzap surrogate (for kvzap): a KVP policy file trained on a\n"
        "                     trace of KVzip targets (kvp trace --targets kvzip)\n"
        "  --budgets LIST     rows per KV head, comma-separated (default " DEFAULT_BUDGETS ")\n"
        "  --split F          evaluate on the text after the first F of it (by bytes, moved to\n"
        "                     a line start: the rule of kvp trace; default 0.8)\n"
        "  --seqs N           ranking / one-shot sequences (default 64)\n"
        "  --seq-len N        tokens per sequence, BOS included (default 512)\n"
        "  --cut N            tokens cached when the cache is ranked / compressed (default 384)\n"
        "  --streams N        streaming texts (default 8)\n"
        "  --stream-len N     tokens per stream, BOS included (default 4 x the context)\n"
        "  --chunk N          streaming eviction chunk (default " KVP_STR(KVP_DEFAULT_CHUNK) ")\n"
        "  --budget-mode M    per_head (every head keeps the budget) or global (the heads\n"
        "                     share budget x heads rows by calibrated score; default per_head)\n"
        "  --kv-type T        how the policies' cache rows are stored: f32, f16 or q8_0\n"
        "                     (default f32; the full-cache references stay f32)\n"
        "  --lookahead N      tokens the streaming oracle looks ahead (default 128)\n"
        "  --kl-every N       streaming fidelity: compare with the model's full window every\n"
        "                     N positions (default 32)\n"
        "  --seed S           seed of the random policy (default 1)\n"
        "  --threads N        worker threads (default: the online CPUs)\n"
        "Writes DIR/results.csv, DIR/results.md and DIR/<protocol>-<metric>.svg.\n",
        kvp_offline_policy_names());
}

__attribute__((format(printf, 1, 2))) static int usage_error(const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    fprintf(stderr, "kvp eval: ");
    vfprintf(stderr, fmt, ap);
    fprintf(stderr, "\n(kvp eval --help for usage)\n");
    va_end(ap);
    return 2;
}

/* The work, shared by the worker threads: phase 0 computes every sequence's reference,
 * phase 1 runs (sequence, policy) and (stream, policy, budget) tasks. Each task has its
 * own accumulator, summed in a fixed order afterwards, so results do not depend on the
 * thread count. */
typedef struct job {
    const kvp_model *m;
    const kvp_eval_opts *o;
    const char *const *policies;
    int n_pol;
    const char *const *stream_pol;     /* the policies that can stream (all but none) */
    int n_spol;
    const char *policy_file, *kvzap_file;
    uint64_t seed;
    int seq_len, stream_len, n_seq, max_tokens;
    const int *seq_tokens;             /* [n_seq][seq_len] */
    const int *stream_tokens;          /* [streams][stream_len] */
    kvp_eval_ref *refs;                /* [n_seq] */
    kvp_eval_stream_ref *stream_refs;  /* [streams] */
    int n_str, bos;
    kvp_eval_acc *seq_acc;             /* [n_seq][n_pol] */
    kvp_eval_acc *stream_acc;          /* [streams][n_spol][n_budgets] */
    /* replies (phase 2; policies are the ones it runs): prompts rendered as a
     * conversation's first turn */
    int *const *prompt_tok;            /* [n_prompts][prompt_len[i]] */
    const int *prompt_len;
    int n_prompts;
    const kvp_template *tpl;
    kvp_eval_acc *reply_acc;           /* [n_prompts][n_pol][n_budgets] */
    /* conversations (phase 3): variants are (policy, protected) pairs */
    const int *conv_story;             /* [n_conv][story_len] */
    int n_conv, story_len, n_cue;
    const int *cue;
    const kvp_conv_opts *conv_o;
    const int *var_pol, *var_protect;  /* [n_var]: index into policies, protection */
    int n_var;
    kvp_conv_acc *conv_acc;            /* [n_conv][n_var][n_budgets] */
    int phase, n_tasks, tty;
    int n_workers;                     /* pool threads; one run state each */
    kvp_runstate *states;              /* [n_workers] */
    char *state_ready;                 /* [n_workers] */
    atomic_int done;
    pthread_mutex_t lock;
    char err[600];
} job;

/* The file a policy reads: kvzap's surrogate, or the kvp policy's for the others. */
static const char *file_for(const char *name, const char *policy_file, const char *kvzap_file)
{
    return !strcmp(name, "kvzap") ? kvzap_file : policy_file;
}

/* Replies task t: (prompt, policy, budget), its own accumulator reply_acc[t]. */
static int run_reply_task(job *j, kvp_runstate *s, int t, char *err, size_t errlen)
{
    int nb = j->o->n_budgets, pr = t / (j->n_pol * nb), pi = t / nb % j->n_pol, bi = t % nb;
    kvp_policy *p;
    int rc = kvp_offline_policy_create(&p, j->policies[pi],
                                       file_for(j->policies[pi], j->policy_file, j->kvzap_file),
                                       &j->m->cfg, j->seed + (uint64_t)pr, err, errlen);
    if (rc)
        return rc;
    rc = kvp_eval_replies(j->m, s, p, j->tpl, j->prompt_tok[pr], j->prompt_len[pr], bi, j->o,
                          NULL, &j->reply_acc[t]);
    if (rc)
        snprintf(err, errlen, "policy %s at budget %d on prompt %d: %s", j->policies[pi],
                 j->o->budgets[bi], pr + 1, strerror(-rc));
    kvp_policy_destroy(p);
    return rc;
}

/* Conversation task t: (conversation, variant, budget), its own accumulator. */
static int run_conv_task(job *j, kvp_runstate *s, int t, char *err, size_t errlen)
{
    int nb = j->o->n_budgets, c = t / (j->n_var * nb), v = t / nb % j->n_var, bi = t % nb;
    const char *name = j->policies[j->var_pol[v]];
    kvp_policy *p;
    int rc = kvp_offline_policy_create(&p, name, file_for(name, j->policy_file, j->kvzap_file),
                                       &j->m->cfg, j->seed + (uint64_t)c, err, errlen);
    if (rc)
        return rc;
    kvp_conv_opts co = *j->conv_o;
    co.protect = j->var_protect[v];
    rc = kvp_conv_run(j->m, s, p, j->conv_story + (size_t)c * j->story_len, j->cue, j->n_cue,
                      bi, j->o, &co, NULL, &j->conv_acc[t]);
    if (rc)
        snprintf(err, errlen, "policy %s%s at budget %d on conversation %d: %s", name,
                 co.protect ? "+protect" : "", j->o->budgets[bi], c + 1, strerror(-rc));
    kvp_policy_destroy(p);
    return rc;
}

/* Task t of the current phase. The random policy's draws depend on the sequence, stream
 * or prompt only, not on the thread that runs it. */
static int run_task(job *j, kvp_runstate *s, int t, char *err, size_t errlen)
{
    const kvp_eval_opts *o = j->o;
    if (j->phase == 2)
        return run_reply_task(j, s, t, err, errlen);
    if (j->phase == 3)
        return run_conv_task(j, s, t, err, errlen);
    if (j->phase == 0) {
        int rc = t < j->n_seq
                     ? kvp_eval_ref_compute(&j->refs[t], j->m, s, j->seq_tokens + (size_t)t * j->seq_len)
                     : kvp_eval_stream_ref_compute(&j->stream_refs[t - j->n_seq], j->m, s,
                                                   j->stream_tokens + (size_t)(t - j->n_seq) * j->stream_len,
                                                   j->bos);
        if (rc)
            snprintf(err, errlen, "%s %d: %s", t < j->n_seq ? "sequence" : "stream",
                     t < j->n_seq ? t : t - j->n_seq, strerror(-rc));
        return rc;
    }
    int seq_tasks = j->n_seq * j->n_pol, is_seq = t < seq_tasks;
    int u = is_seq ? t : t - seq_tasks;
    /* a stream task's indexes only for stream tasks: n_spol is 0 when every policy is
     * one the streams skip (--policies none) */
    int seq = u / j->n_pol, pi = u % j->n_pol;
    int stream = is_seq ? 0 : u / (j->n_spol * o->n_budgets);
    int spi = is_seq ? 0 : u / o->n_budgets % j->n_spol, bi = u % o->n_budgets;
    const char *name = is_seq ? j->policies[pi] : j->stream_pol[spi];
    uint64_t seed = j->seed + (uint64_t)(is_seq ? seq : j->n_seq + stream);
    kvp_policy *p;
    int rc = kvp_offline_policy_create(&p, name, file_for(name, j->policy_file, j->kvzap_file),
                                       &j->m->cfg, seed, err, errlen);
    if (rc)
        return rc;
    if (is_seq)
        rc = kvp_eval_sequence(j->m, s, p, j->seq_tokens + (size_t)seq * j->seq_len,
                               &j->refs[seq], &j->seq_acc[(size_t)seq * j->n_pol + pi]);
    else
        rc = kvp_eval_stream(j->m, s, p, j->stream_tokens + (size_t)stream * j->stream_len,
                             j->stream_len, bi, o, &j->stream_refs[stream],
                             &j->stream_acc[((size_t)stream * j->n_spol + spi) * o->n_budgets + bi]);
    if (rc)
        snprintf(err, errlen, "policy %s on %s %d: %s", name, is_seq ? "sequence" : "stream",
                 is_seq ? seq : stream, strerror(-rc));
    kvp_policy_destroy(p);
    return rc;
}

/* A pool job: task t of the current phase on worker w's run state (made on its first
 * task). The first failure's message is kept. */
static int eval_job(void *arg, int w, int t)
{
    job *j = arg;
    char err[sizeof j->err];
    int rc = 0;
    if (!j->state_ready[w]) {
        if ((rc = kvp_runstate_init(&j->states[w], &j->m->cfg, j->max_tokens)))
            snprintf(err, sizeof err, "out of memory");
        else
            j->state_ready[w] = 1;
    }
    if (!rc)
        rc = run_task(j, &j->states[w], t, err, sizeof err);
    if (rc) {
        pthread_mutex_lock(&j->lock);
        if (!j->err[0])
            memcpy(j->err, err, sizeof err);
        pthread_mutex_unlock(&j->lock);
        return rc;
    }
    /* progress in steps of 5%, on a terminal only */
    int done = atomic_fetch_add(&j->done, 1) + 1;
    if (j->tty && done * 20 / j->n_tasks != (done - 1) * 20 / j->n_tasks) {
        pthread_mutex_lock(&j->lock);
        fprintf(stderr, "\rkvp eval: %s %d/%d",
                j->phase == 3 ? "conversations" : j->phase == 2 ? "replies"
                : j->phase ? "policy runs" : "references", done,
                j->n_tasks);
        pthread_mutex_unlock(&j->lock);
    }
    return 0;
}

/* Each worker's run state, made on its first task (state_ready says which are made). 0 or
 * -1 (out of memory). */
static int job_states_alloc(job *j)
{
    j->states = calloc((size_t)j->n_workers, sizeof *j->states);
    j->state_ready = calloc((size_t)j->n_workers, 1);
    return j->states && j->state_ready ? 0 : -1;
}

static void job_states_free(job *j)
{
    for (int w = 0; j->state_ready && w < j->n_workers; w++)
        if (j->state_ready[w])
            kvp_runstate_free(&j->states[w]);
    free(j->states);
    free(j->state_ready);
}

/* Runs one phase on the offline pool with j->n_workers threads (the calling thread
 * included). 0 or -1. */
static int run_phase(job *j, int phase, int n_tasks)
{
    j->phase = phase;
    j->n_tasks = n_tasks;
    atomic_store(&j->done, 0);
    int rc = kvp_pool_run(j->n_workers, n_tasks, eval_job, j);
    if (j->tty)
        fprintf(stderr, "\n");
    return rc ? -1 : 0;
}

void kvp_eval_defaults(kvp_eval_cli_opts *o)
{
    *o = (kvp_eval_cli_opts){.split = 0.8, .seqs = 64, .seq_len = 512, .cut = 384,
                             .streams = 8, .chunk = KVP_DEFAULT_CHUNK, .lookahead = 128,
                             .kl_every = 32, .seed = 1, .threads = kvp_stage_threads(),
                             .kv_type = KVP_KV_F32, .budget_mode = KVP_BUDGET_PER_HEAD,
                             .reply_len = 256, .turn_len = 40, .turn_reply = 24};
}

/* The command that reruns this evaluation, every setting spelled out (the report's
 * first lines: the same whether kvp eval or kvp learn ran it). */
static void print_command(FILE *f, const kvp_eval_cli_opts *e)
{
    fprintf(f, "kvp eval --model %s", e->model);
    if (e->tokenizer)
        fprintf(f, " --tokenizer %s", e->tokenizer);
    if (e->prompts) {
        fprintf(f, " --prompts %s", e->prompts);
        if (e->max_prompts)
            fprintf(f, " --max-prompts %ld", e->max_prompts);
        fprintf(f, " --out %s", e->out);
        if (e->policies)
            fprintf(f, " --policies %s", e->policies);
        if (e->policy_file)
            fprintf(f, " --policy-file %s", e->policy_file);
        if (e->kvzap_file)
            fprintf(f, " --kvzap-file %s", e->kvzap_file);
        fprintf(f, " --budgets %s --reply-len %ld --chunk %ld --seed %ld --threads %ld"
                " --kv-type %s --budget-mode %s", e->budgets ? e->budgets : DEFAULT_BUDGETS,
                e->reply_len, e->chunk, e->seed, e->threads,
                kvp_kv_type_name((kvp_kv_type)e->kv_type), kvp_budget_mode_name(e->budget_mode));
        return;
    }
    fprintf(f, " %s %s --out %s", e->conversations ? "--conversations" : "--text", e->text, e->out);
    if (e->dialogs) {
        fprintf(f, " --dialogs %ld --turn-len %ld --turn-reply %ld%s", e->dialogs, e->turn_len,
                e->turn_reply, e->protect_turns ? " --protect-turns" : "");
        if (e->policies)
            fprintf(f, " --policies %s", e->policies);
        if (e->policy_file)
            fprintf(f, " --policy-file %s", e->policy_file);
        if (e->kvzap_file)
            fprintf(f, " --kvzap-file %s", e->kvzap_file);
        fprintf(f, " --budgets %s --split %g --chunk %ld --seed %ld --threads %ld --kv-type %s",
                e->budgets ? e->budgets : DEFAULT_BUDGETS, e->split, e->chunk, e->seed,
                e->threads, kvp_kv_type_name((kvp_kv_type)e->kv_type));
        return;
    }
    if (e->policies)
        fprintf(f, " --policies %s", e->policies);
    if (e->policy_file)
        fprintf(f, " --policy-file %s", e->policy_file);
    if (e->kvzap_file)
        fprintf(f, " --kvzap-file %s", e->kvzap_file);
    fprintf(f, " --budgets %s --split %g --seqs %ld --seq-len %ld --cut %ld --streams %ld",
            e->budgets ? e->budgets : DEFAULT_BUDGETS, e->split, e->seqs, e->seq_len, e->cut,
            e->streams);
    if (e->stream_len)
        fprintf(f, " --stream-len %ld", e->stream_len);
    fprintf(f, " --chunk %ld --lookahead %ld --kl-every %ld --seed %ld --threads %ld"
            " --kv-type %s --budget-mode %s", e->chunk, e->lookahead, e->kl_every, e->seed,
            e->threads, kvp_kv_type_name((kvp_kv_type)e->kv_type),
            kvp_budget_mode_name(e->budget_mode));
}

int kvp_cmd_eval(int argc, char **argv)
{
    kvp_eval_cli_opts e;
    kvp_eval_defaults(&e);
    static const struct option opts[] = {
        {"model", 1, 0, 'm'}, {"tokenizer", 1, 0, 'z'}, {"text", 1, 0, 'x'}, {"out", 1, 0, 'o'},
        {"conversations", 1, 0, 'C'}, {"policies", 1, 0, 'P'}, {"policy-file", 1, 0, 'F'}, {"budgets", 1, 0, 'b'},
        {"split", 1, 0, 's'}, {"seqs", 1, 0, 'N'}, {"seq-len", 1, 0, 'n'}, {"cut", 1, 0, 'c'},
        {"streams", 1, 0, 'S'}, {"stream-len", 1, 0, 'L'}, {"chunk", 1, 0, 'k'},
        {"lookahead", 1, 0, 'l'}, {"kl-every", 1, 0, 'K'}, {"seed", 1, 0, 'r'}, {"threads", 1, 0, 't'},
        {"kv-type", 1, 0, 'T'}, {"budget-mode", 1, 0, 'B'}, {"prompts", 1, 0, 'p'},
        {"max-prompts", 1, 0, 'M'}, {"reply-len", 1, 0, 'R'}, {"kvzap-file", 1, 0, 'Z'},
        {"dialogs", 1, 0, 'D'}, {"turn-len", 1, 0, 'U'}, {"turn-reply", 1, 0, 'Y'},
        {"protect-turns", 0, 0, 'G'},
        {"help", 0, 0, 'h'}, {0, 0, 0, 0}};
    int o, idx = 0, reply_opts = 0, conv_opts = 0;
    optind = 1;
    while ((o = getopt_long(argc, argv, "", opts, &idx)) != -1) {
        int ok = 1;
        switch (o) {
        case 'm': e.model = optarg; break;
        case 'z': e.tokenizer = optarg; break;
        case 'x': e.text = optarg; break;
        case 'C': e.text = optarg; e.conversations = 1; break;
        case 'o': e.out = optarg; break;
        case 'P': e.policies = optarg; break;
        case 'F': e.policy_file = optarg; break;
        case 'Z': e.kvzap_file = optarg; break;
        case 'b': e.budgets = optarg; break;
        case 's': ok = kvp_parse_double(optarg, 0.0, 0.99, &e.split); break;
        case 'N': ok = kvp_parse_long(optarg, 1, 1 << 20, &e.seqs); break;
        case 'n': ok = kvp_parse_long(optarg, 3, 1 << 20, &e.seq_len); break;
        case 'c': ok = kvp_parse_long(optarg, 1, 1 << 20, &e.cut); break;
        case 'S': ok = kvp_parse_long(optarg, 0, 1 << 20, &e.streams); break;
        case 'L': ok = kvp_parse_long(optarg, 2, 1 << 24, &e.stream_len); break;
        case 'k': ok = kvp_parse_long(optarg, 1, 1 << 16, &e.chunk); break;
        case 'l': ok = kvp_parse_long(optarg, 1, 1 << 16, &e.lookahead); break;
        case 'K': ok = kvp_parse_long(optarg, 1, 1 << 16, &e.kl_every); break;
        case 'r': ok = kvp_parse_long(optarg, 0, LONG_MAX, &e.seed); break;
        case 't': ok = kvp_parse_long(optarg, 1, 64, &e.threads); break;
        case 'T': ok = (e.kv_type = kvp_kv_type_parse(optarg)) >= 0; break;
        case 'B': ok = (e.budget_mode = kvp_budget_mode_parse(optarg)) >= 0; break;
        case 'p': e.prompts = optarg; break;
        case 'M': ok = kvp_parse_long(optarg, 1, 1 << 24, &e.max_prompts); reply_opts = 1; break;
        case 'R': ok = kvp_parse_long(optarg, 1, 1 << 20, &e.reply_len); reply_opts = 1; break;
        case 'D': ok = kvp_parse_long(optarg, 1, 1 << 20, &e.dialogs); break;
        case 'U': ok = kvp_parse_long(optarg, 2, 1 << 16, &e.turn_len); conv_opts = 1; break;
        case 'Y': ok = kvp_parse_long(optarg, 1, 1 << 16, &e.turn_reply); conv_opts = 1; break;
        case 'G': e.protect_turns = 1; conv_opts = 1; break;
        case 'h': usage(stdout); return 0;
        default: usage(stderr); return 2;
        }
        if (!ok)
            return usage_error("bad value '%s' for --%s", optarg, opts[idx].name);
    }
    if (e.prompts && e.text)
        return usage_error("--prompts cannot be combined with --text or --conversations "
                           "(with --prompts only the replies protocol runs)");
    if (e.dialogs && e.prompts)
        return usage_error("--dialogs runs on --text or --conversations, not --prompts");
    if (conv_opts && !e.dialogs)
        return usage_error("--turn-len, --turn-reply and --protect-turns go with --dialogs");
    if (e.protect_turns && e.budget_mode == KVP_BUDGET_GLOBAL)
        return usage_error("--protect-turns works with --budget-mode per_head only");
    if (reply_opts && !e.prompts)
        return usage_error("--reply-len and --max-prompts go with --prompts");
    if (!e.model || !(e.text || e.prompts) || !e.out || optind < argc)
        return usage_error("--model, --text, --conversations or --prompts, and --out are "
                           "required");
    return kvp_eval_run(&e);
}

/* ---- replies ----------------------------------------------------------------------------- */

/* One user message rendered as kvpd renders a conversation's first turn with no system
 * prompt (turns/turn.c): the model's own Jinja template when it has one the
 * interpreter takes (kvp_session_jinja_turn), else, as there, the family's
 * kvp_template_turn, which adds the template's default system prompt (Qwen 2.5, SmolLM2)
 * itself. The count of *ids (malloc'd), or a negative code. */
static int render_prompt(const kvp_template *t, const char *text, size_t len, int **ids)
{
    if (t->jinja) {
        kvp_chat_msg msg = {1, text, len};
        int keep = 0;
        int n = kvp_template_jinja_turn_tools(t, "", 0, &msg, 1, NULL, 0, NULL, 0, 0, &keep, ids);
        if (n >= 0 || n == -ENOMEM)
            return n;
    }
    return kvp_template_turn(t, "", 0, 1, 0, text, len, ids);
}

typedef struct prompts {
    int **tok;
    int *len;
    int n, lines;          /* prompts kept; lines of the file */
} prompts;

static void prompts_free(prompts *p)
{
    for (int i = 0; i < p->n; i++)
        free(p->tok[i]);
    free(p->tok);
    free(p->len);
    memset(p, 0, sizeof *p);
}

/* The non-empty lines of path (the first max of them; 0: all), each as it is, rendered.
 * 0, or 1 with a message (an unreadable file, a line that is not UTF-8, none left). */
static int prompts_read(prompts *p, const char *path, long max, const kvp_template *t)
{
    memset(p, 0, sizeof *p);
    size_t size;
    char *text = kvp_corpus_read(path, &size);
    if (!text) {
        fprintf(stderr, "kvp eval: cannot read %s: %s\n", path, strerror(errno));
        return 1;
    }
    int cap = 0, status = 1;
    for (size_t at = 0; at < size && (!max || p->n < max);) {
        const char *line = text + at, *nl = memchr(line, '\n', size - at);
        size_t len = nl ? (size_t)(nl - line) : size - at;
        at += len + 1;
        p->lines++;
        if (!len)
            continue;
        if (!kvp_utf8_valid(line, len)) {
            fprintf(stderr, "kvp eval: %s:%d: not valid UTF-8\n", path, p->lines);
            goto out;
        }
        if (p->n == cap) {
            cap = cap ? 2 * cap : 64;
            int **tok = realloc(p->tok, (size_t)cap * sizeof *tok);
            if (tok)
                p->tok = tok;
            int *l = tok ? realloc(p->len, (size_t)cap * sizeof *l) : NULL;
            if (!tok || !l)
                goto oom;
            p->len = l;
        }
        int n = render_prompt(t, line, len, &p->tok[p->n]);
        if (n < 0) {
            fprintf(stderr, "kvp eval: %s:%d: cannot render the message: %s\n", path, p->lines,
                    strerror(-n));
            goto out;
        }
        p->len[p->n++] = n;
    }
    if (!p->n) {
        fprintf(stderr, "kvp eval: %s has no prompt (every line is empty)\n", path);
        goto out;
    }
    status = 0;
    goto out;
oom:
    fprintf(stderr, "kvp eval: out of memory\n");
out:
    free(text);
    if (status)
        prompts_free(p);
    return status;
}

/* kvp eval --prompts: the replies protocol for every policy that can decode (all but the
 * evaluation-only oracle and kvzip) at every budget. The exit status. */
static int replies_run(const kvp_eval_cli_opts *e, const kvp_model *m, char *const *names,
                       int n_pol, kvp_eval_opts *eo)
{
    const char *rpol[MAX_POLICIES];
    int n_rpol = 0, oracle = 0, status = 1, nb = eo->n_budgets;
    for (int i = 0; i < n_pol; i++) {
        if (!kvp_offline_policy_eval_only(names[i]))
            rpol[n_rpol++] = names[i];
        else if (!strcmp(names[i], "oracle"))
            oracle = 1;
        else
            fprintf(stderr, "kvp eval: %s is left out of the replies: it is scored by the "
                    "evaluator, which the decode driver of a reply does not call\n", names[i]);
    }
    if (oracle)
        fprintf(stderr, "kvp eval: oracle is left out of the replies: its scores need the "
                "future of a reply not yet drawn\n");
    if (!n_rpol) {
        fprintf(stderr, "kvp eval: no policy to run (oracle and kvzip have no replies "
                "protocol)\n(kvp eval --help for usage)\n");
        return 2;
    }
    eo->reply_len = (int)e->reply_len;
    kvp_template t;
    char note[512], err[600];
    if (kvp_template_init(&t, m, NULL, note, sizeof note) < 0) {
        fprintf(stderr, "kvp eval: chat template: %s\n", note);
        return 1;
    }
    if (note[0])
        fprintf(stderr, "kvp eval: chat template: %s\n", note);
    prompts pr = {0};
    kvp_eval_acc *task_acc = NULL, *acc = NULL;
    kvp_eval_row *rows = NULL;
    char *intro = NULL;
    size_t intro_len = 0;
    if ((status = prompts_read(&pr, e->prompts, e->max_prompts, &t)))
        goto out;
    status = 1;
    for (int i = 0; i < n_rpol; i++) {
        kvp_policy *p;
        if (kvp_offline_policy_create(&p, rpol[i], file_for(rpol[i], e->policy_file, e->kvzap_file),
                                      &m->cfg, 0, err, sizeof err)) {
            fprintf(stderr, "kvp eval: %s\n", err);
            goto out;
        }
        kvp_policy_destroy(p);
    }
    if (mkdir(e->out, 0777) && errno != EEXIST) {
        fprintf(stderr, "kvp eval: cannot create %s: %s\n", e->out, strerror(errno));
        goto out;
    }
    long tokens = 0;
    int shortest = pr.len[0], longest = pr.len[0], too_long = 0;
    for (int i = 0; i < pr.n; i++) {
        tokens += pr.len[i];
        shortest = pr.len[i] < shortest ? pr.len[i] : shortest;
        longest = pr.len[i] > longest ? pr.len[i] : longest;
        too_long += pr.len[i] > m->cfg.seq_len;
    }
    fprintf(stderr, "kvp eval: %d prompts from %s (%d lines), %d to %d tokens (%s template); "
            "replies of up to %d tokens; %d policies x %d budgets; %ld threads\n", pr.n,
            e->prompts, pr.lines, shortest, longest, kvp_template_name(t.format), eo->reply_len,
            n_rpol, nb, e->threads);

    int n_tasks = pr.n * n_rpol * nb;
    task_acc = calloc((size_t)n_tasks, sizeof *task_acc);
    acc = calloc((size_t)n_rpol, sizeof *acc);
    rows = malloc((size_t)n_rpol * KVP_EVAL_ROWS_PER_POLICY * sizeof *rows);
    if (!task_acc || !acc || !rows)
        goto oom;
    openblas_set_num_threads(1);   /* small matrices: the parallelism is over tasks */
    job j = {.m = m, .o = eo, .policies = rpol, .n_pol = n_rpol,
             .policy_file = e->policy_file, .kvzap_file = e->kvzap_file,
             .seed = (uint64_t)e->seed,
             .max_tokens = (int)e->chunk, .prompt_tok = pr.tok, .prompt_len = pr.len,
             .n_prompts = pr.n, .tpl = &t, .reply_acc = task_acc, .tty = isatty(2),
             .lock = PTHREAD_MUTEX_INITIALIZER, .n_workers = (int)e->threads};
    int states_rc = job_states_alloc(&j);
    double t0 = kvp_now();
    int phase_rc = states_rc ? -1 : run_phase(&j, 2, n_tasks);
    job_states_free(&j);
    if (phase_rc) {
        fprintf(stderr, "kvp eval: %s\n", j.err[0] ? j.err : "out of memory");
        goto out;
    }
    /* the tasks' sums in a fixed order: the same whatever the thread count */
    for (int i = 0; i < n_tasks; i++)
        kvp_eval_acc_add(&acc[i / nb % n_rpol], &task_acc[i]);
    int n_rows = 0;
    for (int p = 0; p < n_rpol; p++)
        n_rows += kvp_eval_rows(rpol[p], &acc[p], eo, rows + n_rows);

    FILE *mf = open_memstream(&intro, &intro_len);
    if (!mf)
        goto oom;
    fprintf(mf, "# kvp eval: %s\n\nCommand:\n\n```\n", m->name);
    print_command(mf, e);
    fprintf(mf, "\n```\n\nPrompts: %d, the non-empty lines of `%s` (%d lines read%s), each "
            "as it is a one-turn conversation, rendered as kvpd renders a conversation's "
            "first turn with no system prompt (%s template): %.1f tokens on average, %d to "
            "%d; %d longer than the context of %d.\n\n"
            "- replies: for every (prompt, policy, budget) a greedy reply of up to %d tokens, "
            "decoded with the policy evicting (chunk %d) as kvpd decodes it at temperature "
            "0, and a full cache (f32, no eviction) fed the same tokens. At every reply "
            "position (the stop token's included): KL(full || evicted) of the next-token "
            "distributions over the whole vocabulary, and whether their most likely tokens "
            "agree. `kl` and `top1` are means over conversations of each one's mean over "
            "its positions (the live canary's weighting), `reply_len` the mean tokens drawn. "
            "A conversation whose prompt and reply would pass the context is left out "
            "(the canary refuses those) and counted as skipped.\n"
            "- `none` never evicts: its cache differs from the full one only by its rows' "
            "type (KL 0 with f32 rows).%s\n",
            pr.n, e->prompts, pr.lines, e->max_prompts ? ", stopped at --max-prompts" : "",
            kvp_template_name(t.format), (double)tokens / pr.n, shortest, longest, too_long,
            m->cfg.seq_len, eo->reply_len, eo->chunk,
            oracle ? " The oracle is left out: its scores need the future of a reply not yet "
                     "drawn." : "");
    size_t row_cost = kvp_cache_row_cost(eo->kv_type, m->cfg.head_dim);
    fprintf(mf, "- cache rows stored as %s: %zu bytes per row per head; %d heads. Budgets: %s.\n",
            kvp_kv_type_name(eo->kv_type), row_cost, m->cfg.n_layers * m->cfg.n_kv_heads,
            eo->budget_mode == KVP_BUDGET_GLOBAL
                ? "global (the heads share B x heads rows by calibrated score, each between "
                  "its floor and its cap)"
                : "per head (every head keeps B rows)");
    fprintf(mf, "\nConversations used / skipped:\n\n| policy |");
    for (int bi = 0; bi < nb; bi++)
        fprintf(mf, " b=%d |", eo->budgets[bi]);
    fprintf(mf, "\n|---|");
    for (int bi = 0; bi < nb; bi++)
        fprintf(mf, "---|");
    fprintf(mf, "\n");
    for (int p = 0; p < n_rpol; p++) {
        fprintf(mf, "| %s |", rpol[p]);
        for (int bi = 0; bi < nb; bi++)
            fprintf(mf, " %ld / %ld |", acc[p].reply_convs[bi], acc[p].reply_skipped[bi]);
        fprintf(mf, "\n");
    }
    if (fclose(mf))
        goto oom;
    if (kvp_eval_write(e->out, rows, n_rows, intro, err, sizeof err)) {
        fprintf(stderr, "kvp eval: %s\n", err);
        goto out;
    }

    printf("%-10s %6s", "policy", "budget");
    printf(" %10s %8s %9s %6s %7s\n", "kl", "top1", "reply_len", "used", "skipped");
    for (int p = 0; p < n_rpol; p++)
        for (int bi = 0; bi < nb; bi++) {
            const kvp_eval_acc *a = &acc[p];
            long c = a->reply_convs[bi];
            printf("%-10s %6d", rpol[p], eo->budgets[bi]);
            if (c)
                printf(" %10.4f %8.3f %9.1f", a->reply_kl[bi] / c, a->reply_top1[bi] / c,
                       (double)a->reply_draws[bi] / c);
            else
                printf(" %10s %8s %9s", "-", "-", "-");
            printf(" %6ld %7ld\n", c, a->reply_skipped[bi]);
        }
    fprintf(stderr, "kvp eval: wrote %s/results.csv, results.md and plots in %.1f s\n", e->out,
            kvp_now() - t0);
    status = 0;
    goto out;
oom:
    fprintf(stderr, "kvp eval: out of memory\n");
    status = 1;
out:
    prompts_free(&pr);
    kvp_template_free(&t);
    free(task_acc);
    free(acc);
    free(rows);
    free(intro);
    return status;
}

/* kvp eval --dialogs: the conversation protocol for every policy but the oracle (and,
 * with --protect-turns, each also protected) at every budget. The exit status. */
static int conv_protocol(const kvp_eval_cli_opts *e, const kvp_model *m, char *const *names,
                         int n_pol, const kvp_eval_opts *eo, const int *ids, long n_ids,
                         size_t at, size_t text_len)
{
    kvp_conv_opts co;
    kvp_conv_defaults(&co);
    co.turn_len = (int)e->turn_len;
    co.reply_len = (int)e->turn_reply;
    int cue[64], nb = eo->n_budgets, status = 1;
    int n_cue = kvp_tokenizer_encode(&m->tok, KVP_CONV_CUE, strlen(KVP_CONV_CUE),
                                     KVP_ENCODE_NO_PREFIX, cue, 64);
    char err[600];
    if (n_cue < 1) {
        fprintf(stderr, "kvp eval: cannot encode the recall cue\n");
        return 1;
    }
    if (kvp_conv_check(&co, m->cfg.seq_len, n_cue, err, sizeof err)) {
        fprintf(stderr, "kvp eval: --turn-len %ld --turn-reply %ld: %s\n", e->turn_len,
                e->turn_reply, err);
        return 2;
    }
    int vpol[2 * MAX_POLICIES], vprot[2 * MAX_POLICIES], n_var = 0;
    char vname[2 * MAX_POLICIES][48];
    for (int i = 0; i < n_pol; i++) {
        if (!strcmp(names[i], "oracle")) {
            fprintf(stderr, "kvp eval: oracle is left out of the conversations: its scores "
                    "need the future of replies not yet drawn\n");
            continue;
        }
        for (int pr = 0; pr <= (e->protect_turns && strcmp(names[i], "none")); pr++) {
            vpol[n_var] = i;
            vprot[n_var] = pr;
            snprintf(vname[n_var], sizeof vname[n_var], "%s%s", names[i], pr ? "+protect" : "");
            n_var++;
        }
    }
    if (!n_var) {
        fprintf(stderr, "kvp eval: no policy to run (the oracle has no conversation "
                "protocol)\n(kvp eval --help for usage)\n");
        return 2;
    }
    int story_len = kvp_conv_story_len(&co), bos = m->tok.bos_id;
    long have = kvp_corpus_count(n_ids, story_len, bos);
    int n_conv = (int)(e->dialogs < have ? e->dialogs : have);
    if (n_conv < 1) {
        fprintf(stderr, "kvp eval: the held-out part of %s (%ld tokens) is too short for a "
                "conversation of %d story tokens\n", e->text, n_ids, story_len);
        return 1;
    }
    if (mkdir(e->out, 0777) && errno != EEXIST) {
        fprintf(stderr, "kvp eval: cannot create %s: %s\n", e->out, strerror(errno));
        return 1;
    }
    int n_tasks = n_conv * n_var * nb;
    int *story = malloc((size_t)n_conv * story_len * sizeof *story);
    kvp_conv_acc *task_acc = calloc((size_t)n_tasks, sizeof *task_acc);
    kvp_conv_acc *acc = calloc((size_t)n_var, sizeof *acc);
    kvp_eval_row *rows = malloc((size_t)n_var * KVP_CONV_ROWS_PER_POLICY * sizeof *rows);
    char *intro = NULL;
    size_t intro_len = 0;
    if (!story || !task_acc || !acc || !rows)
        goto oom;
    for (int i = 0; i < n_conv; i++)
        kvp_corpus_sequence(ids, i, story_len, bos, story + (size_t)i * story_len);
    fprintf(stderr, "kvp eval: held-out text: bytes %zu..%zu of %s, %ld tokens; %d "
            "conversations of %d user turns (%d story tokens + %d reply tokens each), "
            "recall at turns %d and %d; %d variants x %d budgets; %ld threads\n", at, text_len,
            e->text, n_ids, n_conv, co.turns, co.turn_len, co.reply_len, co.recall_at[0],
            co.recall_at[1], n_var, nb, e->threads);
    openblas_set_num_threads(1);
    int max_tokens = n_cue + co.turn_len;
    max_tokens = max_tokens > (int)e->chunk ? max_tokens : (int)e->chunk;
    max_tokens = max_tokens > 128 ? max_tokens : 128;   /* kvzip's reconstruction chunks */
    job j = {.m = m, .o = eo, .policies = (const char *const *)names, .n_pol = n_pol,
             .policy_file = e->policy_file, .kvzap_file = e->kvzap_file,
             .seed = (uint64_t)e->seed, .max_tokens = max_tokens, .conv_story = story,
             .n_conv = n_conv, .story_len = story_len, .n_cue = n_cue, .cue = cue,
             .conv_o = &co, .var_pol = vpol, .var_protect = vprot, .n_var = n_var,
             .conv_acc = task_acc, .tty = isatty(2), .lock = PTHREAD_MUTEX_INITIALIZER,
             .n_workers = (int)e->threads};
    int states_rc = job_states_alloc(&j);
    double t0 = kvp_now();
    int phase_rc = states_rc ? -1 : run_phase(&j, 3, n_tasks);
    job_states_free(&j);
    if (phase_rc) {
        fprintf(stderr, "kvp eval: %s\n", j.err[0] ? j.err : "out of memory");
        goto out;
    }
    for (int i = 0; i < n_tasks; i++)   /* a fixed order: the same for any thread count */
        kvp_conv_acc_add(&acc[i / nb % n_var], &task_acc[i]);
    int n_rows = 0;
    for (int v = 0; v < n_var; v++)
        n_rows += kvp_conv_rows(vname[v], &acc[v], eo, &co, rows + n_rows);
    FILE *mf = open_memstream(&intro, &intro_len);
    if (!mf)
        goto oom;
    fprintf(mf, "# kvp eval: %s\n\nCommand:\n\n```\n", m->name);
    print_command(mf, e);
    fprintf(mf, "\n```\n\nHeld-out text: bytes %zu..%zu of `%s` (%ld tokens). %d "
            "conversations, conversation i reading the i-th run of %d tokens (BOS first).\n\n"
            "- turns: user turn k (1..%d) is the story's tokens [%d(k-1), %dk); after it the "
            "model draws a greedy reply of %d tokens under eviction (chunk %d) and a full "
            "cache (f32, no eviction) is fed the same tokens; at each turn's end the "
            "policy's cache is compressed to the budget (the daemon's turn boundary). `kl` "
            "is the mean over conversations of the mean over turns of each reply's mean "
            "KL(full || evicted); `kl_tK` the same for turn K alone.\n"
            "- recall: user turn N (%d, %d) asks for turn 1 again: `%s` (%d tokens) and then "
            "turn 1's %d tokens after BOS, teacher-forced on copies of both caches as that "
            "turn finds them, no eviction. `recall_N` is the mean log-likelihood per token "
            "of turn 1's text (nats), `recall_gap_N` the full cache's minus the policy's, "
            "`kept_t1_N` the share of turn 1's rows the policy's cache still holds then.\n"
            "- `P+protect`: the policy with per-turn protection, the rows a turn's "
            "compression kept ranking above every newer row at later evictions.\n"
            "- cache rows stored as %s; budgets per head.\n",
            at, text_len, e->text, n_ids, n_conv, story_len, co.turns, co.turn_len,
            co.turn_len, co.reply_len, eo->chunk, co.recall_at[0], co.recall_at[1],
            "\\nTell me the start of the story again.\\n", n_cue, co.turn_len - 1,
            kvp_kv_type_name(eo->kv_type));
    if (fclose(mf))
        goto oom;
    if (kvp_eval_write(e->out, rows, n_rows, intro, err, sizeof err)) {
        fprintf(stderr, "kvp eval: %s\n", err);
        goto out;
    }
    printf("%-26s %6s %8s %9s %9s %9s %9s %7s\n", "policy", "budget", "kl", "recall4", "gap4",
           "recall8", "gap8", "kept8");
    for (int v = 0; v < n_var; v++)
        for (int bi = 0; bi < nb; bi++) {
            double c = (double)acc[v].convs[bi];
            if (!c)
                continue;
            printf("%-26s %6d %8.4f %9.3f %9.3f %9.3f %9.3f %7.3f\n", vname[v], eo->budgets[bi],
                   acc[v].kl[bi] / c, acc[v].recall[bi][0] / c,
                   (acc[v].recall_full[bi][0] - acc[v].recall[bi][0]) / c,
                   acc[v].recall[bi][1] / c,
                   (acc[v].recall_full[bi][1] - acc[v].recall[bi][1]) / c,
                   acc[v].kept_t1[bi][1] / c);
        }
    fprintf(stderr, "kvp eval: wrote %s/results.csv, results.md and plots in %.1f s\n", e->out,
            kvp_now() - t0);
    status = 0;
    goto out;
oom:
    fprintf(stderr, "kvp eval: out of memory\n");
out:
    free(story);
    free(task_acc);
    free(acc);
    free(rows);
    free(intro);
    return status;
}

int kvp_eval_run(const kvp_eval_cli_opts *e)
{
    const char *model_path = e->model, *tok_path = e->tokenizer, *text_path = e->text,
               *out_dir = e->out, *policy_file = e->policy_file;
    const char *pol_arg = e->policies, *bud_arg = e->budgets;
    int conversations = e->conversations, kv_type = e->kv_type, budget_mode = e->budget_mode;
    long n_seqs = e->seqs, seq_len = e->seq_len, cut = e->cut, n_streams = e->streams,
         stream_len = e->stream_len, chunk = e->chunk, lookahead = e->lookahead,
         kl_every = e->kl_every, seed = e->seed, threads = e->threads;
    double split = e->split;
    if (cut >= seq_len)
        return usage_error("--cut %ld must be below --seq-len %ld", cut, seq_len);
    if (threads < 1)
        threads = 1;

    /* policies: the list given, or every policy (kvp only when there is a file for it) */
    char names_buf[512], *names[MAX_POLICIES];
    int n_pol;
    if (pol_arg) {
        snprintf(names_buf, sizeof names_buf, "%s", pol_arg);
    } else {
        snprintf(names_buf, sizeof names_buf, "%s", kvp_offline_policy_names());
        for (char *c = names_buf; *c; c++)
            *c = *c == ' ' ? ',' : *c;
    }
    if (!kvp_split_list(names_buf, names, MAX_POLICIES, &n_pol))
        return usage_error("bad policy list '%s'", pol_arg);
    for (int i = 0; i < n_pol; i++) {
        if (kvp_eval_policy_index(names[i]) < 0)
            return usage_error("unknown policy '%s' (one of: %s)", names[i], kvp_offline_policy_names());
        for (int k = 0; k < i; k++)
            if (!strcmp(names[k], names[i]))
                return usage_error("policy '%s' listed twice", names[i]);
        if (!strcmp(names[i], "kvp") && !policy_file) {
            if (pol_arg)
                return usage_error("policy kvp needs --policy-file");
            memmove(&names[i], &names[i + 1], (size_t)(--n_pol - i) * sizeof *names);
            i--;
            fprintf(stderr, "kvp eval: no --policy-file, so kvp is left out\n");
        } else if (!strcmp(names[i], "kvzap") && !e->kvzap_file) {
            if (pol_arg)
                return usage_error("policy kvzap needs --kvzap-file");
            memmove(&names[i], &names[i + 1], (size_t)(--n_pol - i) * sizeof *names);
            i--;
            fprintf(stderr, "kvp eval: no --kvzap-file, so kvzap is left out\n");
        }
    }
    int kvzip = 0;
    for (int i = 0; i < n_pol; i++)
        kvzip |= !strcmp(names[i], "kvzip");

    /* budgets, ascending */
    char bud_buf[512], *fields[KVP_EVAL_MAX_BUDGETS + 1];
    int n_fields;
    kvp_eval_opts eo = {.cut = (int)cut, .chunk = (int)chunk, .lookahead = (int)lookahead,
                       .kv_type = (kvp_kv_type)kv_type, .budget_mode = budget_mode,
                       .kvzip = kvzip};
    snprintf(bud_buf, sizeof bud_buf, "%s", bud_arg ? bud_arg : DEFAULT_BUDGETS);
    if (!kvp_split_list(bud_buf, fields, KVP_EVAL_MAX_BUDGETS, &n_fields))
        return usage_error("bad budget list '%s' (at most %d positive integers, comma-separated)",
                           bud_arg, KVP_EVAL_MAX_BUDGETS);
    for (int i = 0; i < n_fields; i++) {
        long b;
        if (!kvp_parse_long(fields[i], 1, 1 << 20, &b))
            return usage_error("bad budget '%s' in '%s' (a positive integer)", fields[i], bud_arg);
        int k = eo.n_budgets++;
        for (; k > 0 && eo.budgets[k - 1] > b; k--)
            eo.budgets[k] = eo.budgets[k - 1];
        if (k > 0 && eo.budgets[k - 1] == b)
            return usage_error("budget %ld listed twice", b);
        eo.budgets[k] = (int)b;
    }

    char err[600];
    kvp_model m;
    if (kvp_model_load(&m, model_path, tok_path, err, sizeof err)) {
        fprintf(stderr, "kvp eval: %s\n", err);
        return 1;
    }
    int status = 1, ctx = m.cfg.seq_len;
    if (e->prompts) {
        status = replies_run(e, &m, names, n_pol, &eo);
        kvp_model_free(&m);
        return status;
    }
    char *text = NULL, *intro = NULL;
    int *ids = NULL, *seq_tokens = NULL, *stream_tokens = NULL;
    kvp_eval_ref *refs = NULL;
    kvp_eval_stream_ref *stream_refs = NULL;
    kvp_eval_acc *seq_acc = NULL, *stream_acc = NULL, *acc = NULL;
    kvp_eval_row *rows = NULL;
    size_t intro_len = 0;
    int n_refs = 0, n_stream_refs = 0;
    if (!stream_len)
        stream_len = 4L * ctx;
    if (seq_len > ctx && !e->dialogs) {
        fprintf(stderr, "kvp eval: --seq-len %ld exceeds the model's context %d\n", seq_len, ctx);
        status = 2;
        goto out;
    }
    if (!e->dialogs && n_streams && eo.budgets[eo.n_budgets - 1] + chunk > ctx) {
        fprintf(stderr, "kvp eval: budget %d + chunk %ld exceeds the model's context %d "
                "(streaming needs room for a chunk; --streams 0 skips it)\n",
                eo.budgets[eo.n_budgets - 1], chunk, ctx);
        status = 2;
        goto out;
    }

    size_t text_len;
    if (!(text = kvp_corpus_read(text_path, &text_len))) {
        fprintf(stderr, "kvp eval: cannot read %s: %s\n", text_path, strerror(errno));
        goto out;
    }
    size_t at = kvp_trace_split_at(text, text_len, split);
    char cerr[512];
    long n_ids = kvp_corpus_tokens(&m, text_path, text, at, text_len, conversations, &ids, cerr,
                                   sizeof cerr);
    if (n_ids < 0) {
        fprintf(stderr, "kvp eval: %s\n", cerr);
        goto out;
    }
    if (e->dialogs) {
        status = conv_protocol(e, &m, names, n_pol, &eo, ids, n_ids, at, text_len);
        goto out;
    }
    int bos = m.tok.bos_id;
    long have_seqs = kvp_corpus_count(n_ids, seq_len, bos);
    long have_streams = kvp_corpus_count(n_ids, stream_len, bos);
    int n_seq = (int)(n_seqs < have_seqs ? n_seqs : have_seqs);
    int n_str = (int)(n_streams < have_streams ? n_streams : have_streams);
    if (n_seq < 1 || (n_streams && n_str < 1)) {
        fprintf(stderr, "kvp eval: the held-out part of %s (%ld tokens) is too short for a "
                "sequence of %ld tokens%s\n", text_path, n_ids, seq_len,
                n_streams ? " and a stream" : "");
        goto out;
    }
    /* every policy loads (a bad policy file fails here, before any work) */
    for (int i = 0; i < n_pol; i++) {
        kvp_policy *p;
        if (kvp_offline_policy_create(&p, names[i], file_for(names[i], policy_file, e->kvzap_file),
                                      &m.cfg, 0, err, sizeof err)) {
            fprintf(stderr, "kvp eval: %s\n", err);
            goto out;
        }
        kvp_policy_destroy(p);
    }
    if (mkdir(out_dir, 0777) && errno != EEXIST) {
        fprintf(stderr, "kvp eval: cannot create %s: %s\n", out_dir, strerror(errno));
        goto out;
    }

    const char *spol[MAX_POLICIES];
    int n_spol = 0;
    for (int i = 0; i < n_pol; i++)
        if (strcmp(names[i], "none"))  /* no eviction cannot pass the context */
            spol[n_spol++] = names[i];
    if (!n_spol)
        n_str = 0;
    fprintf(stderr, "kvp eval: held-out text: bytes %zu..%zu of %s (after the first %.2f), %ld "
            "tokens\nkvp eval: %d sequences of %ld tokens (cut %ld), %d streams of %ld tokens; "
            "%d policies x %d budgets; %ld threads\n", at, text_len, text_path, split, n_ids,
            n_seq, seq_len, cut, n_str, stream_len, n_pol, eo.n_budgets, threads);

    seq_tokens = malloc((size_t)n_seq * seq_len * sizeof *seq_tokens);
    stream_tokens = malloc(((size_t)n_str * stream_len + 1) * sizeof *stream_tokens);
    refs = calloc((size_t)n_seq, sizeof *refs);
    stream_refs = calloc((size_t)n_str + 1, sizeof *stream_refs);
    seq_acc = calloc((size_t)n_seq * n_pol, sizeof *seq_acc);
    stream_acc = calloc((size_t)n_str * n_spol * eo.n_budgets + 1, sizeof *stream_acc);
    acc = calloc((size_t)n_pol, sizeof *acc);
    rows = malloc((size_t)n_pol * KVP_EVAL_ROWS_PER_POLICY * sizeof *rows);
    if (!seq_tokens || !stream_tokens || !refs || !stream_refs || !seq_acc || !stream_acc ||
        !acc || !rows)
        goto oom;
    /* the sequences kvp trace makes of the validation part */
    for (int i = 0; i < n_seq; i++)
        kvp_corpus_sequence(ids, i, seq_len, bos, seq_tokens + (size_t)i * seq_len);
    for (int i = 0; i < n_str; i++)
        kvp_corpus_sequence(ids, i, stream_len, bos, stream_tokens + (size_t)i * stream_len);
    for (; n_refs < n_seq; n_refs++)
        if (kvp_eval_ref_init(&refs[n_refs], &m.cfg, (int)seq_len, &eo))
            goto oom;
    for (; n_stream_refs < n_str; n_stream_refs++)
        if (kvp_eval_stream_ref_init(&stream_refs[n_stream_refs], &m.cfg, (int)stream_len,
                                     (int)kl_every))
            goto oom;

    openblas_set_num_threads(1);   /* small matrices: the parallelism is over tasks */
    long max_tokens = seq_len > lookahead ? seq_len : lookahead;
    max_tokens = max_tokens > kl_every ? max_tokens : kl_every;
    job j = {.m = &m, .o = &eo, .policies = (const char *const *)names, .n_pol = n_pol,
              .stream_pol = spol, .n_spol = n_spol, .policy_file = policy_file,
              .kvzap_file = e->kvzap_file,
              .seed = (uint64_t)seed, .seq_len = (int)seq_len, .stream_len = (int)stream_len,
              .n_seq = n_seq,
              .max_tokens = (int)(max_tokens > chunk ? max_tokens : chunk),
              .seq_tokens = seq_tokens, .stream_tokens = stream_tokens, .refs = refs,
              .stream_refs = stream_refs, .n_str = n_str, .bos = bos,
              .seq_acc = seq_acc, .stream_acc = stream_acc, .tty = isatty(2),
              .lock = PTHREAD_MUTEX_INITIALIZER, .n_workers = (int)threads};
    int states_rc = job_states_alloc(&j);
    double t0 = kvp_now();
    int phases_rc = states_rc ? -1
                    : run_phase(&j, 0, n_seq + n_str) ||
                      run_phase(&j, 1, n_seq * n_pol + n_str * n_spol * eo.n_budgets);
    job_states_free(&j);
    if (phases_rc) {
        fprintf(stderr, "kvp eval: %s\n", j.err[0] ? j.err : "out of memory");
        goto out;
    }
    double full_nll = 0.0;
    for (int i = 0; i < n_seq; i++)
        full_nll += refs[i].nll;
    for (int i = 0; i < n_seq; i++)
        for (int p = 0; p < n_pol; p++)
            kvp_eval_acc_add(&acc[p], &seq_acc[(size_t)i * n_pol + p]);
    for (int i = 0; i < n_str; i++)
        for (int p = 0; p < n_spol; p++)
            for (int bi = 0; bi < eo.n_budgets; bi++) {
                int pi = 0;
                while (strcmp(names[pi], spol[p]))
                    pi++;
                kvp_eval_acc_add(&acc[pi], &stream_acc[((size_t)i * n_spol + p) * eo.n_budgets + bi]);
            }
    int n_rows = 0;
    for (int p = 0; p < n_pol; p++)
        n_rows += kvp_eval_rows(names[p], &acc[p], &eo, rows + n_rows);

    /* results.md starts with what was run, on what */
    FILE *mf = open_memstream(&intro, &intro_len);
    if (!mf)
        goto oom;
    fprintf(mf, "# kvp eval: %s\n\nCommand:\n\n```\n", m.name);
    print_command(mf, e);
    fprintf(mf, "\n```\n\nHeld-out text: bytes %zu..%zu of `%s` (%ld tokens): the part after "
            "the first %.2f of the file, cut at a line start by the rule of `kvp trace`, so "
            "a policy trained on that trace's training sequences never saw it.\n\n"
            "- ranking and one-shot: %d sequences of %ld tokens (BOS + text); the cache holds "
            "the first %ld when it is ranked or compressed, the other %ld are the future. "
            "Ranking cases: %d (sequence, layer, KV head). Full-cache perplexity of these "
            "sequences: %.3f.\n"
            "- streaming: %d streams of %ld tokens (%.1fx the context of %d), chunk %ld, "
            "context shift; the oracle looks %ld tokens ahead. Fidelity every %ld positions: "
            "KL(full window || policy) and top-1 agreement, the full window being the plain "
            "cache within the context and, past it, the model run fresh on BOS + the last "
            "%d tokens.\n"
            "- eviction keeps the 4 oldest rows (sinks) and the 16 newest of every head "
            "(H2O, SnapKV, LagKV and StreamingLLM keep more of the newest by their own rules); "
            "`none` never evicts: it gives the full-cache numbers, has no ranking and cannot "
            "stream past the context.\n"
            "- evaluation only (the daemon cannot run them): `oracle` (true future "
            "importance) and `kvzip` (KVzip's context-reconstruction scores: the largest "
            "attention a teacher-forced \"repeat the context\" pass pays each row, computed "
            "on the prefix and, streaming, before every chunk that evicts).\n",
            at, text_len, text_path, n_ids, split, n_seq, seq_len, cut, seq_len - cut,
            n_seq * m.cfg.n_layers * m.cfg.n_kv_heads,
            exp(full_nll / ((double)n_seq * (seq_len - 1))), n_str, stream_len,
            (double)stream_len / ctx, ctx, chunk, lookahead, kl_every, ctx - 1);
    /* what a budget costs: the x axis of a quality-per-byte comparison */
    size_t row_cost = kvp_cache_row_cost((kvp_kv_type)kv_type, m.cfg.head_dim);
    fprintf(mf, "- cache rows stored as %s: %zu bytes per row per head (key, value, position, "
            "token index, score, policy state); %d heads, so a budget of B rows per head "
            "holds B x %zu bytes per session. Budgets: %s.\n",
            kvp_kv_type_name((kvp_kv_type)kv_type), row_cost, m.cfg.n_layers * m.cfg.n_kv_heads,
            row_cost * (size_t)(m.cfg.n_layers * m.cfg.n_kv_heads),
            budget_mode == KVP_BUDGET_GLOBAL
                ? "global (the heads share B x heads rows by calibrated score, each between "
                  "its floor and its cap)"
                : "per head (every head keeps B rows)");
    if (fclose(mf))
        goto oom;
    if (kvp_eval_write(out_dir, rows, n_rows, intro, err, sizeof err)) {
        fprintf(stderr, "kvp eval: %s\n", err);
        goto out;
    }

    printf("%-10s %8s", "policy", "C/C*");
    for (int bi = 0; bi < eo.n_budgets; bi++)
        printf("  ppl@%-4d", eo.budgets[bi]);
    for (int bi = 0; bi < eo.n_budgets; bi++)
        printf(" sppl@%-4d", eo.budgets[bi]);
    printf("   (ppl: one-shot, sppl: streaming)\n");
    for (int p = 0; p < n_pol; p++) {
        kvp_eval_row r[KVP_EVAL_ROWS_PER_POLICY];
        int nr = kvp_eval_rows(names[p], &acc[p], &eo, r), k = 0;
        printf("%-10s", names[p]);
        if (acc[p].cases)
            printf(" %8.3f", r[k].value);
        else
            printf(" %8s", "-");
        k = acc[p].cases ? 1 + 2 * eo.n_budgets : 0;
        for (int bi = 0; bi < eo.n_budgets; bi++)
            printf("  %8.3f", r[k + bi].value);
        k += 2 * eo.n_budgets;
        for (int bi = 0; bi < eo.n_budgets; bi++)
            if (k + bi < nr)
                printf("  %8.3f", r[k + bi].value);
            else
                printf("  %8s", "-");
        printf("\n");
    }
    fprintf(stderr, "kvp eval: wrote %s/results.csv, results.md and plots in %.1f s\n", out_dir,
            kvp_now() - t0);
    status = 0;
    goto out;
oom:
    fprintf(stderr, "kvp eval: out of memory\n");
out:
    for (int i = 0; i < n_refs; i++)
        kvp_eval_ref_free(&refs[i]);
    for (int i = 0; i < n_stream_refs; i++)
        kvp_eval_stream_ref_free(&stream_refs[i]);
    free(refs);
    free(stream_refs);
    free(seq_acc);
    free(stream_acc);
    free(acc);
    free(rows);
    free(seq_tokens);
    free(stream_tokens);
    free(ids);
    free(text);
    free(intro);
    kvp_model_free(&m);
    return status;
}
