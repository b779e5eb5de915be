/* /metrics: the daemon's counters, histograms and gauges (observe/metrics.h) in the
 * Prometheus text format 0.0.4, and the protocol's error codes mapped to their counters.
 * Loop thread. */
#ifndef KVPD_WEB_METRICS_H
#define KVPD_WEB_METRICS_H

#include <stddef.h>

#include "observe/metrics.h"

/* Maps a protocol error code to its counter (unknown codes count as internal). */
enum kvpd_err_kind kvpd_err_kind_of(const char *code);
/* Renders the exposition text; malloc'd, NULL when out of memory. */
char *kvpd_metrics_render(const kvpd_metrics *m, const kvpd_gauges *g, size_t *len);

#endif
