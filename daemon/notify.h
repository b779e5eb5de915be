/* systemd's notify protocol (sd_notify(3)) without libsystemd: one datagram per message
 * to the AF_UNIX socket named in $NOTIFY_SOCKET (a path, or "@name" for an abstract
 * socket). Without $NOTIFY_SOCKET (not under systemd, or Type= is not notify) every call
 * is a no-op. Failures are logged once and never fatal: the daemon works without it. */
#ifndef KVPD_NOTIFY_H
#define KVPD_NOTIFY_H

#include <stdint.h>

/* Sends the formatted text as one datagram, e.g. kvpd_notify("READY=1\nSTATUS=%s", s).
 * Returns 1 when sent, 0 when NOTIFY_SOCKET is unset or empty, or a negative errno. */
int kvpd_notify(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* The watchdog interval systemd expects WATCHDOG=1 within (WatchdogSec=), in
 * microseconds, from $WATCHDOG_USEC; 0 when unset, malformed, or when $WATCHDOG_PID is
 * set to another process. Send WATCHDOG=1 every half of it. */
uint64_t kvpd_notify_watchdog_usec(void);

#endif
