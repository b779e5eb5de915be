/* base/thread.c: a thread's name as the kernel keeps it, and its nice value raised for
 * it alone (Linux keeps one per thread), never lowered. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <string.h>

#include "base/thread.h"

typedef struct seen {
    int before, after, again;
    char name[16];
} seen;

static void *background(void *arg)
{
    seen *w = arg;
    w->before = kvp_thread_nice_now();
    cr_assert_eq(kvp_thread_nice(KVP_BACKGROUND_NICE), 0);
    w->after = kvp_thread_nice_now();
    cr_assert_eq(kvp_thread_nice(KVP_BACKGROUND_NICE - 5), 0, "asking for less is no error");
    w->again = kvp_thread_nice_now();
    kvp_thread_name("kvpd-a-name-longer-than-fifteen");
    pthread_getname_np(pthread_self(), w->name, sizeof w->name);
    return NULL;
}

Test(thread, nice_is_raised_for_the_calling_thread_only_and_never_lowered)
{
    int mine = kvp_thread_nice_now();
    cr_assert_lt(mine, KVP_BACKGROUND_NICE, "run the suite below nice %d", KVP_BACKGROUND_NICE);
    seen w;
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, background, &w), 0);
    pthread_join(th, NULL);
    cr_assert_eq(w.before, mine, "a new thread starts at its creator's nice");
    cr_assert_eq(w.after, KVP_BACKGROUND_NICE);
    cr_assert_eq(w.again, KVP_BACKGROUND_NICE, "a smaller value leaves it alone");
    cr_assert_eq(kvp_thread_nice_now(), mine, "the caller's own is untouched");
    cr_assert_str_eq(w.name, "kvpd-a-name-lon", "the first 15 bytes are kept");
}
