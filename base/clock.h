/* Clocks, in seconds as doubles: monotonic for durations and timeouts, wall for what is
 * stored (snapshot times). */
#ifndef KVP_CLOCK_H
#define KVP_CLOCK_H

double kvp_now(void);        /* CLOCK_MONOTONIC */
double kvp_wall_now(void);   /* CLOCK_REALTIME, seconds since the epoch */

#endif
