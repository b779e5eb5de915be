/* The eviction policy in force, and SIGHUP. A policy conf is made off the loop (it reads
 * and checks the policy file) and swapped in on the loop: new sessions, and sessions
 * coming back from disk, take the new one; resident sessions keep theirs. */
#ifndef KVPD_RELOAD_H
#define KVPD_RELOAD_H

#include <stddef.h>

#include "daemon/kvpd.h"

/* Thread pool: the policy cfg names (the default one when none: config.h), made by the
 * hub (kvp_hub_policy_make). `note` says what was chosen, for the log. */
int kvpd_policy_conf_make(const kvpd_config *cfg, const kvp_model *model,
                          struct kvp_policy_conf **out, char *note, size_t notelen,
                          char *err, size_t errlen);

/* SIGHUP (loop): re-reads the command line's config file and the policy file on the
 * thread pool, then applies the keys that can change live and swaps the policy; a bad
 * file is refused with a log line ("reload refused: ...") and the old one keeps
 * serving. */
void kvpd_reload(kvpd *d);

/* One turn's cache reservation at the budget and policy in force (the memory cap must
 * hold at least that). */
size_t kvpd_turn_bytes(const kvpd *d);

/* Tells systemd (and the log) the daemon serves: READY=1 and a STATUS= line (at start
 * and after each reload). */
void kvpd_announce_ready(kvpd *d);

#endif
