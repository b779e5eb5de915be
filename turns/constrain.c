/* Constrained replies (turns/session.h): the turn's grammar matcher masks the logits
 * before the sampler draws, and takes the drawn token's bytes after. The mask is one walk
 * of the vocabulary's byte trie (model/grammar.h); stop tokens are allowed only once the
 * document is whole, and are then the only choice when nothing else can follow. */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "model/grammar.h"
#include "turns/session.h"

int kvp_session_grammar_usable(const kvp_vocab_trie *tr, char *err, size_t errlen)
{
    if (tr->n_nodes == 0) {
        snprintf(err, errlen, "constrained decoding needs text tokens and this model's "
                 "vocabulary has none");
        return -EINVAL;
    }
    if (tr->n_end == 0) {
        snprintf(err, errlen, "constrained decoding ends a reply with a stop token and this "
                 "model's chat template has none");
        return -EINVAL;
    }
    return 0;
}

int kvp_session_turn_grammar(kvp_session *s, kvp_grammar *g, const kvp_vocab_trie *tr,
                             int *need)
{
    kvp_turn *t = &s->turn;
    kvp_turn_grammar_free(t);
    if (!g)
        return 0;
    t->gm = malloc(sizeof *t->gm);
    int rc = t->gm ? kvp_gmatch_init(t->gm, g) : -ENOMEM;
    if (rc == 0 && t->gm->cur.n == 0 && !t->gm->cur.complete) {
        kvp_gmatch_free(t->gm);   /* nothing can open a document: the turn could not start */
        rc = -EINVAL;
    } else if (rc == 0 && tr && (rc = kvp_gmatch_bind(t->gm, tr)) < 0) {
        kvp_gmatch_free(t->gm);
    } else if (rc == 0 && s->rq.spec.max_tokens > 0 &&
               kvp_gmatch_distance(t->gm) > s->rq.spec.max_tokens) {
        if (need)
            *need = kvp_gmatch_distance(t->gm);
        kvp_gmatch_free(t->gm);   /* a whole document could not fit: refused, not cut */
        rc = -E2BIG;
    }
    if (rc < 0) {
        free(t->gm);
        t->gm = NULL;
        kvp_turn_grammar_free(t);
        return rc;
    }
    return 0;
}

void kvp_turn_grammar_free(kvp_turn *t)
{
    if (t->gm) {
        kvp_gmatch_free(t->gm);
        free(t->gm);
    }
    free(t->gmask);
    t->gm = NULL;
    t->gmask = NULL;
}

int kvp_turn_doc_whole(const kvp_turn *t)
{
    return t->gm && kvp_gmatch_complete(t->gm);
}

static int allowed(const uint32_t *mask, int tok)
{
    return (mask[tok >> 5] >> (tok & 31)) & 1;
}

int kvp_turn_draw(kvp_session *s, const kvp_session_env *env, float *logits)
{
    kvp_turn *t = &s->turn;
    if (!t->gm)   /* env->trie is read only by constrained turns: they start after it is made */
        return kvp_sample(&s->sampler, logits);
    const kvp_vocab_trie *tr = env->trie;
    if (!tr)
        return kvp_sample(&s->sampler, logits);
    int vocab = s->sampler.vocab_size;
    if (!t->gmask && !(t->gmask = calloc(((size_t)tr->vocab_size + 31) / 32, sizeof *t->gmask)))
        return tr->n_end ? tr->end_tok[0] : kvp_sample(&s->sampler, logits);
    /* the length budget: only tokens after which the document still fits in the tokens
     * the reply has left, so it always ends whole */
    int n = kvp_gmatch_mask_left(t->gm, tr, t->gmask,
                                 s->rq.spec.max_tokens - t->stats.generated_tokens);
    t->gshaped |= t->gm->shaped;
    if (n <= 0)   /* no token continues it (or no memory): the reply ends here */
        return tr->n_end ? tr->end_tok[0] : kvp_sample(&s->sampler, logits);
    kvp_grammar_apply_mask(logits, t->gmask, vocab < tr->vocab_size ? vocab : tr->vocab_size);
    for (int i = tr->vocab_size; i < vocab; i++)
        logits[i] = -__builtin_inff();
    int tok = kvp_sample(&s->sampler, logits);
    if (tok < 0 || tok >= tr->vocab_size || !allowed(t->gmask, tok)) {
        /* the sampler fell back past the mask (every allowed logit NaN): take the first
         * allowed token instead */
        for (tok = 0; tok < tr->vocab_size && !allowed(t->gmask, tok); tok++)
            ;
    }
    for (int k = 0; k < tr->n_end; k++)
        if (tok == tr->end_tok[k])
            return tok;
    size_t len = 0;
    const char *p = kvp_tokenizer_piece(&env->model->tok, -1, tok, &len);
    if (p && len)
        kvp_gmatch_accept(t->gm, p, len);   /* allowed: it is accepted */
    return tok;
}

int kvp_session_start_grammar(kvp_session *s, const kvp_session_env *env, char *err,
                              size_t errlen)
{
    const kvp_turn_spec *sp = &s->rq.spec;
    int need = 0;
    int rc = kvp_session_turn_grammar(s, sp->gsrc, env->trie, &need);
    if (rc == -EINVAL)
        snprintf(err, errlen, "the grammar has no document that can be started");
    else if (rc == -E2BIG && need >= KVP_GRAMMAR_FAR)
        snprintf(err, errlen, "the response format's documents cannot be written with this "
                 "model's vocabulary (a byte they need has no token of its own)");
    else if (rc == -E2BIG && sp->gasked)
        snprintf(err, errlen, "max_tokens (%d) is too small for the response format: its "
                 "shortest complete reply may take %d tokens; raise max_tokens (Responses: "
                 "max_output_tokens) to at least %d", sp->max_tokens, need, need);
    else if (rc == -E2BIG)
        snprintf(err, errlen, "the daemon's max_tokens ceiling (%d) is too small for the "
                 "response format: its shortest complete reply may take %d tokens",
                 sp->max_tokens, need);
    else if (rc < 0)
        snprintf(err, errlen, "out of memory starting the grammar's matcher (%d states)",
                 kvp_grammar_states(sp->gsrc));
    return rc;
}

int kvp_session_trie_build(kvp_vocab_trie *tr, const kvp_session_env *env)
{
    int rc = kvp_vocab_trie_build(tr, &env->model->tok);
    if (rc < 0)
        return rc;
    if (env->model->cfg.vocab_size > tr->vocab_size)
        tr->vocab_size = env->model->cfg.vocab_size;   /* the mask covers every logit */
    tr->n_end = 0;
    for (int i = 0; i < env->model->cfg.vocab_size && tr->n_end < 8; i++)
        if (kvp_template_is_stop(&env->tpl, i))
            tr->end_tok[tr->n_end++] = i;
    return 0;
}
