/* Internals of the chat templates shared by template.c (the hand-written families) and
 * template_jinja.c (the model's own Jinja template): the token run builder. Text between
 * two special tokens is collected and encoded as one run. */
#ifndef KVP_TEMPLATE_IMPL_H
#define KVP_TEMPLATE_IMPL_H

#include "model/template.h"

/* Marker ids per format (see the renderers); -1 when the vocabulary lacks one. */
enum { MK_OPEN, MK_CLOSE, MK_EOT, MK_END, MK_SYSTEM, MK_USER, MK_ASSISTANT, N_MK };

typedef struct tpl_priv {
    int mk[N_MK];
} tpl_priv;

typedef struct render {
    const kvp_template *t;
    tpl_priv p;
    int *v;
    int n, cap;
    char *text;            /* the pending text run */
    size_t tn, tcap;
    int run_start;         /* the pending run starts a segment (dummy prefix) */
    int rc;
} render;

void kvp_tpl_start(render *r, const kvp_template *t);
void kvp_tpl_txt(render *r, const char *s, size_t len);   /* text, encoded as text */
void kvp_tpl_tok(render *r, int id);                      /* a token by id */
int kvp_tpl_finish(render *r, int **out);                 /* the count, or a negative code */

/* template_tools.c: a JSON text as a template value (NULL if not JSON or out of memory),
 * and a conversation's messages appended to list as the template's dicts (with reasoning,
 * a reply's reasoning block as its reasoning_content, model/reasoning.h). */
struct kvp_jarena;
struct kvp_jv;
struct kvp_jv *kvp_tpl_json(struct kvp_jarena *a, const char *text, size_t len);
int kvp_tpl_jinja_messages(struct kvp_jarena *a, struct kvp_jv *list, enum kvp_tool_format f,
                           int reasoning, const kvp_chat_msg *msgs, int n);

#endif
