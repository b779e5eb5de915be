#include "base/clock.h"

#include <time.h>

static double clock_s(clockid_t id)
{
    struct timespec ts;
    clock_gettime(id, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

double kvp_now(void) { return clock_s(CLOCK_MONOTONIC); }

double kvp_wall_now(void) { return clock_s(CLOCK_REALTIME); }
