/* model/reasoning.c: a reply's reasoning block and answer, whole and streamed in pieces of
 * every size (the stream gives exactly the whole split's parts). */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "model/reasoning.h"

static void whole_in(const char *text, int opened, int found, const char *reasoning,
                     const char *content)
{
    size_t n = strlen(text);
    kvp_reasoning_parts p = kvp_reasoning_split_in(text, n, opened);
    cr_assert_eq(p.found, found, "%s", text);
    cr_assert_eq(p.r_to - p.r_from, strlen(reasoning), "%s: reasoning %.*s", text,
                 (int)(p.r_to - p.r_from), text + p.r_from);
    cr_assert_eq(memcmp(text + p.r_from, reasoning, strlen(reasoning)), 0, "%s", text);
    cr_assert_eq(p.c_to - p.c_from, strlen(content), "%s: content %.*s", text,
                 (int)(p.c_to - p.c_from), text + p.c_from);
    cr_assert_eq(memcmp(text + p.c_from, content, strlen(content)), 0, "%s", text);
    /* streamed in pieces of every size: the same parts */
    for (size_t step = 1; step <= n + 1; step++) {
        kvp_reasoning_stream s = {.opened = opened};
        char r[512] = "", c[512] = "";
        size_t rn = 0, cn = 0;
        for (size_t at = 0;; at += step) {
            size_t k = at >= n ? 0 : n - at < step ? n - at : step;
            int final = at + k >= n;
            kvp_reasoning_delta d;
            cr_assert_eq(kvp_reasoning_feed(&s, text + (at < n ? at : n), k, final, &d), 0);
            if (d.reasoning_len)
                memcpy(r + rn, d.reasoning, d.reasoning_len);
            rn += d.reasoning_len;
            if (d.content_len)
                memcpy(c + cn, d.content, d.content_len);
            cn += d.content_len;
            if (final)
                break;
        }
        cr_assert_str_eq(r, reasoning, "%s in pieces of %zu", text, step);
        cr_assert_str_eq(c, content, "%s in pieces of %zu", text, step);
        cr_assert_eq(s.found, found);
        kvp_reasoning_free(&s);
    }
}

static void whole(const char *text, int found, const char *reasoning, const char *content)
{
    whole_in(text, 0, found, reasoning, content);
    kvp_reasoning_parts a = kvp_reasoning_split(text, strlen(text)),
                        b = kvp_reasoning_split_in(text, strlen(text), 0);
    cr_assert(a.found == b.found && a.r_from == b.r_from && a.r_to == b.r_to &&
              a.c_from == b.c_from && a.c_to == b.c_to, "split is split_in with opened 0: %s", text);
}

Test(reasoning, a_block_then_the_answer)
{
    whole("<think>\nLet me see.\n</think>\n\nHello.", 1, "Let me see.", "Hello.");
    whole("  <think>a</think>b", 1, "a", "b");
    whole("<think></think>\n\nJust this.", 1, "", "Just this.");
    whole("<think>\n\n</think>\n\n", 1, "", "");
    whole("<think>x < y, </thin is not it</think>ok", 1, "x < y, </thin is not it", "ok");
    whole("<think>a</think>b</think>c", 1, "a", "b</think>c");
}

Test(reasoning, a_block_never_closed_is_all_reasoning)
{
    whole("<think>\nstill thinking ", 1, "still thinking", "");
    whole("<think>", 1, "", "");
    whole("<think>ends in </thi", 1, "ends in </thi", "");
}

Test(reasoning, a_reply_without_the_opening_is_all_answer)
{
    whole("Hello <think>not a block</think>", 0, "", "Hello <think>not a block</think>");
    whole("  <thin", 0, "", "  <thin");
    whole("<", 0, "", "<");
    whole("", 0, "", "");
    whole(" \n", 0, "", " \n");
    whole("<thinking>x", 0, "", "<thinking>x");
}

/* A prompt that opened the block (a template whose generation prompt ends with <think>):
 * the reply starts inside it, so its text up to </think> is the reasoning, whole and
 * streamed alike; the opening marker written again is skipped; never closed, it is all
 * reasoning. */
Test(reasoning, a_reply_inside_a_block_the_prompt_opened)
{
    whole_in("Let me see.\n</think>\n\nHello.", 1, 1, "Let me see.", "Hello.");
    whole_in("\n  a</think>b", 1, 1, "a", "b");
    whole_in("</think>\n\nJust this.", 1, 1, "", "Just this.");
    whole_in("<think>\nagain</think>ok", 1, 1, "again", "ok");
    whole_in("<thinking about it</think>ok", 1, 1, "<thinking about it", "ok");
    whole_in("still thinking ", 1, 1, "still thinking", "");
    whole_in("", 1, 1, "", "");
    whole_in("<thi", 1, 1, "<thi", "");
    /* the same texts without an opened block are all answer */
    whole_in("Let me see.\n</think>\n\nHello.", 0, 0, "", "Let me see.\n</think>\n\nHello.");
}
