/* What the KVP agent tests share: architectures, a deterministic filler, the policy
 * file's checksum and integers written out as docs/policy-format.md specifies them. */
#include <criterion/criterion.h>
#include <errno.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "offline/agent_train.h"
#include "policy/kvp_agent.h"
#include "policy/policy.h"
#include "tests/model/testutil.h"
#include "tests/policy/agentutil.h"

const kvp_agent_arch small_arch = {.d = 3, .P = 4, .E = 3, .H = 5, .pmax = 6};
const kvp_agent_arch default_arch = {.d = 8,
                                            .P = KVP_AGENT_DEFAULT_P,
                                            .E = KVP_AGENT_DEFAULT_E,
                                            .H = KVP_AGENT_DEFAULT_H,
                                            .pmax = KVP_AGENT_DEFAULT_PMAX};

uint64_t rng_state = 12345;

float frand(void)   /* uniform [-1, 1) */
{
    rng_state = rng_state * 6364136223846793005ull + 1442695040888963407ull;
    return (float)(rng_state >> 40) / 8388608.0f - 1.0f;
}

void fill(float *x, size_t n, float scale)
{
    for (size_t i = 0; i < n; i++)
        x[i] = scale * frand();
}

/* The checksum written out as docs/policy-format.md specifies it: standard FNV-1a 64. */
uint64_t fnv1a_ref(const uint8_t *p, size_t n)
{
    uint64_t h = 14695981039346656037ull;
    for (size_t i = 0; i < n; i++)
        h = (h ^ p[i]) * 0x100000001b3ull;
    return h;
}

uint32_t rd32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void wr32(uint8_t *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

uint64_t rd64(const uint8_t *p)
{
    return (uint64_t)rd32(p) | (uint64_t)rd32(p + 4) << 32;
}

void wr64(uint8_t *p, uint64_t v)
{
    wr32(p, (uint32_t)v);
    wr32(p + 4, (uint32_t)(v >> 32));
}

/* Recomputes the trailing checksum so a test reaches the check it targets. */
void reseal(uint8_t *buf, size_t len)
{
    wr64(buf + len - 8, fnv1a_ref(buf, len - 8));
}

const char *tmp_path(void)
{
    static char paths[4][64];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, sizeof paths[0], "/tmp/kvp-agent-test-%d-%d.kvp", (int)getpid(), next);
    return p;
}

/* A 5 x 4 x head_dim 8 set (stories260K's shape) saved to a file; returns the path. */
const char *write_policy(const kvp_agent_arch *a, int layers, int kvh, uint64_t seed)
{
    char err[256];
    kvp_agent_set s;
    cr_assert_eq(kvp_agent_set_alloc(&s, layers, kvh, a, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(&s, seed);
    const char *path = tmp_path();
    cr_assert_eq(kvp_agent_set_save(&s, path, err, sizeof err), 0, "%s", err);
    kvp_agent_set_free(&s);
    return path;
}

const kvp_agent_arch tiny_arch = {.d = 8, .P = 6, .E = 4, .H = 5, .pmax = 16};

/* Loading buf must fail with a message containing `want`. */
void expect_bad(const void *buf, size_t len, const char *want, int code)
{
    const char *path = tu_write_tmp(buf, len);
    char err[512] = "";
    kvp_agent_set s;
    int rc = kvp_agent_set_load(&s, path, NULL, err, sizeof err);
    cr_assert_eq(rc, code, "%s: rc %d, expected %d (%s)", want, rc, code, err);
    cr_assert(strstr(err, want), "message '%s' lacks '%s'", err, want);
    cr_assert(strstr(err, path), "message '%s' does not name the file", err);
    cr_assert_null(s.params);
    unlink(path);
}

/* A calibrated set of 2 x 3 agents, K knots each: agent a's scores a + 0, 1, ..., its
 * values (a + 1) x 0, 1, 4, 9, ... */
void calibrate_tiny(kvp_agent_set *s, int K)
{
    char err[512];
    cr_assert_eq(kvp_agent_set_alloc(s, 2, 3, &tiny_arch, err, sizeof err), 0, "%s", err);
    kvp_agent_set_init(s, 3);
    float knots[6 * 2 * 8];
    for (int a = 0; a < 6; a++)
        for (int i = 0; i < K; i++) {
            knots[a * 2 * K + i] = (float)(a + i);
            knots[a * 2 * K + K + i] = (float)((a + 1) * i * i);
        }
    cr_assert_eq(kvp_agent_set_calibration(s, K, knots, err, sizeof err), 0, "%s", err);
}
