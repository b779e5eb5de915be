/* Log lines to stderr with a level tag (journald adds the timestamps under systemd). */
#ifndef KVP_LOG_H
#define KVP_LOG_H

void kvpd_log(const char *level, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

#endif
