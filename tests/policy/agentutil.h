/* Helpers of the KVP agent tests (agentutil.c). */
#ifndef KVP_TESTS_AGENTUTIL_H
#define KVP_TESTS_AGENTUTIL_H

#include <stddef.h>
#include <stdint.h>

#include "policy/kvp_agent.h"

extern const kvp_agent_arch small_arch;    /* d 3, P 4, E 3, H 5, pmax 6 */
extern const kvp_agent_arch default_arch;  /* d 8 and the default sizes */
extern const kvp_agent_arch tiny_arch;     /* d 8, P 6, E 4, H 5, pmax 16 */
extern uint64_t rng_state;
float frand(void);                          /* uniform [-1, 1) */
void fill(float *x, size_t n, float scale);
/* Standard FNV-1a 64, the policy file's checksum. */
uint64_t fnv1a_ref(const uint8_t *p, size_t n);
uint32_t rd32(const uint8_t *p);
void wr32(uint8_t *p, uint32_t v);
uint64_t rd64(const uint8_t *p);
void wr64(uint8_t *p, uint64_t v);
/* Recomputes the trailing checksum so a test reaches the check it targets. */
void reseal(uint8_t *buf, size_t len);
const char *tmp_path(void);
/* A layers x kvh set with random agents of arch a saved to a temporary file; its path. */
const char *write_policy(const kvp_agent_arch *a, int layers, int kvh, uint64_t seed);
/* Loading buf must fail with rc code and a message containing want and the path. */
void expect_bad(const void *buf, size_t len, const char *want, int code);
/* A calibrated set of 2 x 3 agents, K knots each. */
void calibrate_tiny(kvp_agent_set *s, int K);

#endif
