/* Thread names and nice values (base/thread.h). Linux gives each thread its own nice
 * value, set by its tid through setpriority(PRIO_PROCESS). */
#include "base/thread.h"

#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

void kvp_thread_name(const char *name)
{
    char n[16];
    snprintf(n, sizeof n, "%s", name);
    pthread_setname_np(pthread_self(), n);
}

static id_t self_tid(void)
{
    return (id_t)syscall(SYS_gettid);
}

long kvp_thread_self_id(void)
{
    return (long)self_tid();
}

int kvp_thread_nice_now(void)
{
    errno = 0;
    int v = getpriority(PRIO_PROCESS, self_tid());
    return v == -1 && errno ? 0 : v;
}

int kvp_thread_nice(int nice)
{
    if (kvp_thread_nice_now() >= nice)
        return 0;
    return setpriority(PRIO_PROCESS, self_tid(), nice) < 0 ? -errno : 0;
}
