/* The policy file: writing, and reading with every size validated against the file's
 * length before anything is allocated (docs/policy-format.md has the layout). */
#include "policy/kvp_agent.h"

#include "base/bytes.h"
#include "base/checksum.h"
#include "base/errors.h"
#include "base/fileio.h"

#include <errno.h>
#include <math.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* Parameters are stored as raw host floats; the file format is little-endian IEEE f32. */
_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "policy files hold little-endian f32: add byte swapping for this host");
_Static_assert(sizeof(float) == 4, "f32 parameters");
_Static_assert(sizeof(size_t) >= 8, "parameter counts up to 2^42 need a 64-bit size_t");

/* ---------------------------------------------------------------- file format */

static const uint8_t MAGIC[8] = {'K', 'V', 'P', 'P', 'O', 'L', 0, 1};
#define FORMAT_VERSION 4u
/* Version 1: the 48 bytes of shape. Version 2 adds the model the agents were trained for:
 * u64 weights fingerprint (kvp_model_config.fingerprint) and its name, 64 bytes NUL-padded.
 * Version 3 adds the calibration after the parameters: u32 n_knots (2..256), then per agent
 * n_knots f32 scores and n_knots f32 values. A set without a calibration is written as
 * version 2, so an uncalibrated policy's file is unchanged. Version 4 adds to the header
 * a u32 of input flags (bit 0: centred keys, kvp_agent_arch.centered; the others 0), and
 * its calibration section is always there, with 0 knots when there is none. Only a set
 * with centred or relative keys is written as version 4. Flag bit 1 (relative keys,
 * kvp_agent_arch.relative) adds the rotation right after the flags: u32 n_rot, u32 layout
 * (1: NeoX halves), f32 base, u32 n_factors (0 or n_rot / 2), f32 factors[n_factors].
 * Flag bit 2 (fitted caps, kvp_agent_set.caps) adds after that the caps block: u32
 * n_budgets (1..16), u32 budgets[n_budgets] (ascending), u32 caps[n_layers][n_budgets]
 * (0: the default); a set with caps is written as version 4 whatever its keys. */
#define HEADER_V1_BYTES 48
#define HEADER_BYTES (HEADER_V1_BYTES + 8 + KVP_POLICY_MODEL_NAME)
#define HEADER_V4_BYTES (HEADER_BYTES + 4)
#define INPUT_CENTERED 1u
#define INPUT_RELATIVE 2u
#define INPUT_CAPS 4u
#define INPUT_KNOWN (INPUT_CENTERED | INPUT_RELATIVE | INPUT_CAPS)
#define ROPE_BYTES 16
#define CHECKSUM_BYTES 8

int kvp_agent_set_save(const kvp_agent_set *s, const char *path, char *err, size_t errlen)
{
    char tmp[4096];
    if ((size_t)snprintf(tmp, sizeof tmp, "%s.XXXXXX", path) >= sizeof tmp) {
        kvp_errorf(err, errlen, 0, "%s: path too long", path);
        return -ENAMETOOLONG;
    }
    int fd = mkstemp(tmp);
    if (fd < 0) {
        int rc = -errno;
        kvp_errorf(err, errlen, 0, "%s: cannot create a temporary file: %s", path, strerror(errno));
        return rc;
    }
    FILE *f = fdopen(fd, "wb");
    if (!f) {
        int rc = -errno;
        kvp_errorf(err, errlen, 0, "%s: %s", tmp, strerror(errno));
        close(fd);
        unlink(tmp);
        return rc;
    }

    int v4 = s->arch.centered || s->arch.relative || s->caps;
    uint8_t hdr[HEADER_V4_BYTES + ROPE_BYTES + 4 * KVP_AGENT_MAX_D / 2];
    size_t hdr_bytes = v4 ? HEADER_V4_BYTES : HEADER_BYTES;
    int cal_section = s->n_knots || v4;
    memcpy(hdr, MAGIC, 8);
    kvp_put_u32(hdr + 8, v4 ? 4u : s->n_knots ? 3u : 2u);
    kvp_put_u32(hdr + HEADER_BYTES, (s->arch.centered ? INPUT_CENTERED : 0u) |
                                        (s->arch.relative ? INPUT_RELATIVE : 0u) |
                                        (s->caps ? INPUT_CAPS : 0u));
    if (s->arch.relative) {   /* the rotation block (kvp_agent_set_rope checked it) */
        int nf = s->rope.factors ? s->rope.n_rot / 2 : 0;
        kvp_put_u32(hdr + hdr_bytes, (uint32_t)s->rope.n_rot);
        kvp_put_u32(hdr + hdr_bytes + 4, (uint32_t)s->rope.neox);
        memcpy(hdr + hdr_bytes + 8, &s->rope.base, 4);
        kvp_put_u32(hdr + hdr_bytes + 12, (uint32_t)nf);
        if (nf)
            memcpy(hdr + hdr_bytes + ROPE_BYTES, s->rope.factors, (size_t)nf * 4u);
        hdr_bytes += ROPE_BYTES + (size_t)nf * 4u;
    }
    /* the caps block: n_budgets, budgets, then the table */
    int nb = s->caps ? s->n_cap_budgets : 0;
    size_t caps_bytes = s->caps ? 4u * (1u + (size_t)nb + (size_t)s->n_layers * nb) : 0;
    uint8_t *caps = caps_bytes ? malloc(caps_bytes) : NULL;
    if (caps_bytes && !caps) {
        kvp_errorf(err, errlen, 0, "%s: out of memory", path);
        fclose(f);
        unlink(tmp);
        return -ENOMEM;
    }
    if (caps) {
        kvp_put_u32(caps, (uint32_t)nb);
        for (int b = 0; b < nb; b++)
            kvp_put_u32(caps + 4 + 4 * (size_t)b, (uint32_t)s->cap_budgets[b]);
        for (size_t i = 0; i < (size_t)s->n_layers * nb; i++)
            kvp_put_u32(caps + 4 * (1 + (size_t)nb + i), (uint32_t)s->caps[i]);
    }
    kvp_put_u32(hdr + 12, (uint32_t)s->n_layers);
    kvp_put_u32(hdr + 16, (uint32_t)s->n_kv_heads);
    kvp_put_u32(hdr + 20, (uint32_t)s->arch.d);
    kvp_put_u32(hdr + 24, (uint32_t)s->arch.P);
    kvp_put_u32(hdr + 28, (uint32_t)s->arch.E);
    kvp_put_u32(hdr + 32, (uint32_t)s->arch.H);
    kvp_put_u32(hdr + 36, (uint32_t)s->arch.pmax);
    kvp_put_u64(hdr + 40, s->n_params);
    kvp_put_u64(hdr + 48, s->model_fingerprint);
    memset(hdr + 56, 0, KVP_POLICY_MODEL_NAME);
    memcpy(hdr + 56, s->model_name, strnlen(s->model_name, KVP_POLICY_MODEL_NAME - 1));

    size_t nf = (size_t)s->n_layers * (size_t)s->n_kv_heads * s->n_params;
    size_t nk = (size_t)s->n_layers * (size_t)s->n_kv_heads * 2u * (size_t)s->n_knots;
    uint8_t cal[4], tail[CHECKSUM_BYTES];
    kvp_put_u32(cal, (uint32_t)s->n_knots);
    uint64_t sum = kvp_fnv1a(KVP_FNV1A_INIT, hdr, hdr_bytes);
    if (caps)
        sum = kvp_fnv1a(sum, caps, caps_bytes);
    sum = kvp_fnv1a(sum, s->params, nf * sizeof(float));
    if (cal_section)
        sum = kvp_fnv1a(sum, cal, sizeof cal);
    if (s->n_knots)
        sum = kvp_fnv1a(sum, s->knots, nk * sizeof(float));
    kvp_put_u64(tail, sum);

    /* The daemon may run as another user: make the file world-readable like a normal
     * create would (mkstemp uses 0600). */
    errno = 0;
    int ok = fchmod(fd, 0644) == 0 && fwrite(hdr, 1, hdr_bytes, f) == hdr_bytes &&
             (!caps || fwrite(caps, 1, caps_bytes, f) == caps_bytes) &&
             fwrite(s->params, sizeof(float), nf, f) == nf &&
             (!cal_section || fwrite(cal, 1, sizeof cal, f) == sizeof cal) &&
             (!s->n_knots || fwrite(s->knots, sizeof(float), nk, f) == nk) &&
             fwrite(tail, 1, sizeof tail, f) == sizeof tail && fflush(f) == 0 &&
             fsync(fd) == 0;
    int saved = errno ? errno : EIO;   /* a short fwrite need not set errno */
    free(caps);
    if (fclose(f) != 0 && ok) {
        ok = 0;
        saved = errno;
    }
    if (ok && rename(tmp, path) != 0) {
        ok = 0;
        saved = errno;
    }
    if (!ok) {
        kvp_errorf(err, errlen, 0, "%s: write failed: %s", path, strerror(saved));
        unlink(tmp);
        return -saved;
    }
    return 0;
}

/* Validates the header's sizes before anything is allocated (check_size then checks the
 * file's length against them). */
static int parse_header(const uint8_t *hdr, uint64_t file_size, const char *path,
                        int *n_layers, int *n_kv_heads, kvp_agent_arch *a, int *header_bytes,
                        int *calibrated, char *err, size_t errlen)
{
    if (memcmp(hdr, MAGIC, 8) != 0) {
        kvp_errorf(err, errlen, 0, "%s: not a KVP policy file (bad magic)", path);
        return -EINVAL;
    }
    uint32_t version = kvp_get_u32(hdr + 8);
    if (version < 1 || version > FORMAT_VERSION) {
        kvp_errorf(err, errlen, 0, "%s: unsupported policy file version %u (this build reads 1 to %u)",
               path, version, FORMAT_VERSION);
        return -EINVAL;
    }
    *header_bytes = version == 1 ? HEADER_V1_BYTES : version == 4 ? HEADER_V4_BYTES : HEADER_BYTES;
    *calibrated = version >= 3;   /* the calibration section is there (version 4: maybe empty) */
    static const struct { const char *name; int off; int64_t max; } fields[] = {
        {"n_layers", 12, KVP_AGENT_MAX_LAYERS}, {"n_kv_heads", 16, KVP_AGENT_MAX_KV_HEADS},
        {"head_dim", 20, KVP_AGENT_MAX_D},      {"width P", 24, KVP_AGENT_MAX_WIDTH},
        {"position dim E", 28, KVP_AGENT_MAX_WIDTH}, {"hidden H", 32, KVP_AGENT_MAX_WIDTH},
        {"position table size pmax", 36, KVP_AGENT_MAX_PMAX},
    };
    int v[7];
    for (int i = 0; i < 7; i++) {
        char msg[160];
        if (kvp_agent_check_range(fields[i].name, kvp_get_u32(hdr + fields[i].off), fields[i].max, msg,
                        sizeof msg)) {
            kvp_errorf(err, errlen, 0, "%s: %s", path, msg);
            return -EINVAL;
        }
        v[i] = (int)kvp_get_u32(hdr + fields[i].off);
    }
    *n_layers = v[0];
    *n_kv_heads = v[1];
    *a = (kvp_agent_arch){.d = v[2], .P = v[3], .E = v[4], .H = v[5], .pmax = v[6]};

    uint64_t np = kvp_agent_n_params(a), stored = kvp_get_u64(hdr + 40);
    if (stored != np) {
        kvp_errorf(err, errlen, 0,
               "%s: parameter count %llu per agent does not match the sizes "
               "(d=%d P=%d E=%d H=%d pmax=%d need %llu)",
               path, (unsigned long long)stored, a->d, a->P, a->E, a->H, a->pmax,
               (unsigned long long)np);
        return -EINVAL;
    }
    if (file_size < (uint64_t)*header_bytes + CHECKSUM_BYTES) {
        kvp_errorf(err, errlen, 0, "%s: truncated: %llu bytes, %llu agents x %llu parameters "
                   "do not fit", path, (unsigned long long)file_size,
                   (unsigned long long)v[0] * (unsigned long long)v[1], (unsigned long long)np);
        return -EINVAL;
    }
    return 0;
}

/* The file size against the header (header_bytes with the rotation block) and the sizes. */
static int check_size(uint64_t file_size, int n_layers, int n_kv_heads, const kvp_agent_arch *a,
                      uint64_t header_bytes, int calibrated, const char *path, char *err,
                      size_t errlen)
{
    uint64_t np = kvp_agent_n_params(a);
    uint64_t v[2] = {(uint64_t)n_layers, (uint64_t)n_kv_heads};
    /* Compare by division first: absurd sizes would overflow the byte count. */
    uint64_t agents = v[0] * v[1];
    uint64_t want = np > file_size / 4u / agents
                        ? UINT64_MAX
                        : header_bytes + agents * np * 4u + CHECKSUM_BYTES;
    /* versions 3 and 4: the knot count and at least its u32; read_calibration checks
     * that the count matches the bytes left before it allocates the knots */
    if (calibrated && want != UINT64_MAX) {
        want += 4;
        if (file_size > want)
            want = file_size;
    }
    if (file_size < want) {
        kvp_errorf(err, errlen, 0,
               "%s: truncated: %llu bytes, %llu agents x %llu parameters do not fit", path,
               (unsigned long long)file_size, (unsigned long long)agents,
               (unsigned long long)np);
        return -EINVAL;
    }
    if (file_size > want) {
        kvp_errorf(err, errlen, 0, "%s: %llu trailing bytes after the checksum", path,
               (unsigned long long)(file_size - want));
        return -EINVAL;
    }
    return 0;
}

/* The calibration section of versions 3 and 4, after the parameters: the knot count must
 * match the bytes left (parse_header checked they hold a whole number of knots per agent);
 * version 4 may have none (0 knots, no bytes). */
static int read_calibration(kvp_agent_set *s, FILE *f, uint64_t file_size, int header_bytes,
                            int v4, uint64_t *sum, const char *path, char *err, size_t errlen)
{
    uint8_t cal[4];
    if (fread(cal, 1, sizeof cal, f) != sizeof cal) {
        kvp_errorf(err, errlen, 0, "%s: read error", path);
        return -EIO;
    }
    uint64_t agents = (uint64_t)s->n_layers * (uint64_t)s->n_kv_heads;
    uint64_t left = file_size - (uint64_t)header_bytes - agents * s->n_params * 4u - 4u - CHECKSUM_BYTES;
    uint32_t k = kvp_get_u32(cal);
    if (k == 0 && v4 && left == 0) {
        *sum = kvp_fnv1a(*sum, cal, sizeof cal);
        return 0;
    }
    if (k < 2 || k > KVP_CALIBRATION_MAX_KNOTS || left != agents * 8u * k) {
        kvp_errorf(err, errlen, 0, "%s: calibration of %u knots does not match the %llu bytes "
                   "it has (2..%d knots per agent)", path, k, (unsigned long long)left,
                   KVP_CALIBRATION_MAX_KNOTS);
        return -EINVAL;
    }
    size_t nk = (size_t)agents * 2u * k;
    float *knots = malloc(nk * sizeof *knots);
    if (!knots) {
        kvp_errorf(err, errlen, 0, "%s: out of memory", path);
        return -ENOMEM;
    }
    if (fread(knots, sizeof(float), nk, f) != nk) {
        free(knots);
        kvp_errorf(err, errlen, 0, "%s: read error (file changed while reading?)", path);
        return -EIO;
    }
    *sum = kvp_fnv1a(kvp_fnv1a(*sum, cal, sizeof cal), knots, nk * sizeof(float));
    s->knots = knots;
    s->n_knots = (int)k;
    return 0;
}

static int check_params(const kvp_agent_set *s, const char *path, char *err, size_t errlen)
{
    for (int l = 0; l < s->n_layers; l++)
        for (int h = 0; h < s->n_kv_heads; h++) {
            const float *w = kvp_agent_set_params(s, l, h);
            for (size_t i = 0; i < s->n_params; i++)
                if (!isfinite(w[i])) {
                    kvp_errorf(err, errlen, 0, "%s: parameter %zu of agent (layer %d, KV head %d) "
                           "is not finite", path, i, l, h);
                    return -EINVAL;
                }
        }
    return 0;
}

static int check_calibration(const kvp_agent_set *s, const char *path, char *err, size_t errlen)
{
    for (int l = 0; l < s->n_layers && s->n_knots; l++)
        for (int h = 0; h < s->n_kv_heads; h++) {
            const float *x = kvp_agent_set_knots(s, l, h);
            char msg[256];
            if (kvp_agent_check_knots(s->n_knots, x, x + s->n_knots, l, h, msg, sizeof msg)) {
                kvp_errorf(err, errlen, 0, "%s: %s", path, msg);
                return -EINVAL;
            }
        }
    return 0;
}

static int check_shape(const kvp_agent_set *s, const kvp_model_config *cfg,
                       const char *path, char *err, size_t errlen)
{
    if (s->n_layers == cfg->n_layers && s->n_kv_heads == cfg->n_kv_heads &&
        s->arch.d == cfg->head_dim)
        return 0;
    kvp_errorf(err, errlen, 0,
           "%s: policy file is for %d layers x %d KV heads x head_dim %d, "
           "model has %d layers x %d KV heads x head_dim %d",
           path, s->n_layers, s->n_kv_heads, s->arch.d, cfg->n_layers, cfg->n_kv_heads,
           cfg->head_dim);
    return -EINVAL;
}

/* A file bound to a model (version 2) loads only for that model's weights; an unbound
 * file (version 1) or an unknown model (fingerprint 0, as in the tests' shapes) is
 * checked by shape alone. */
static int check_model(const kvp_agent_set *s, const kvp_model_config *cfg,
                       const char *path, char *err, size_t errlen)
{
    if (!s->model_fingerprint || !cfg->fingerprint || s->model_fingerprint == cfg->fingerprint)
        return 0;
    kvp_errorf(err, errlen, 0,
               "%s: policy file is for the model '%s' (weights %016llx), not this one (weights "
               "%016llx); make one for this model with `kvp learn --model MODEL`",
               path, s->model_name, (unsigned long long)s->model_fingerprint,
               (unsigned long long)cfg->fingerprint);
    return -EINVAL;
}

/* Relative keys are turned back with the rotation the agents were trained with: a model
 * that rotates its keys another way (another base, layout or factors in its metadata)
 * would show them keys in another frame. Checked against a loaded model only (a shape
 * made for a trace has no rotation). */
static int check_rope(const kvp_agent_set *s, const kvp_model_config *cfg, const char *path,
                      char *err, size_t errlen)
{
    if (!s->arch.relative || !cfg->fingerprint || kvp_rope_same(&s->rope, &cfg->rope))
        return 0;
    kvp_errorf(err, errlen, 0,
               "%s: policy file's agents turn keys back with RoPE of %d dims (%s, base %g%s), "
               "the model rotates %d dims (%s, base %g%s); make one for this model with "
               "`kvp learn --model MODEL`",
               path, s->rope.n_rot, s->rope.neox ? "NeoX" : "pairs", (double)s->rope.base,
               s->rope.factors ? ", with factors" : "", cfg->rope.n_rot,
               cfg->rope.neox ? "NeoX" : "pairs", (double)cfg->rope.base,
               cfg->rope.factors ? ", with factors" : "");
    return -EINVAL;
}

int kvp_agent_set_check_model(const kvp_agent_set *s, const kvp_model_config *cfg,
                              const char *what, char *err, size_t errlen)
{
    int rc = check_shape(s, cfg, what, err, errlen);
    if (!rc)
        rc = check_model(s, cfg, what, err, errlen);
    return rc ? rc : check_rope(s, cfg, what, err, errlen);
}

/* Policy files read by this process (kvp_agent_set_loads). */
static atomic_ullong set_loads;

unsigned long long kvp_agent_set_loads(void)
{
    return atomic_load(&set_loads);
}

int kvp_agent_set_load(kvp_agent_set *s, const char *path, const kvp_model_config *cfg,
                       char *err, size_t errlen)
{
    memset(s, 0, sizeof *s);
    atomic_fetch_add(&set_loads, 1);
    FILE *f = kvp_fopen_input(path);
    if (!f) {
        int rc = -errno;
        kvp_errorf(err, errlen, 0, "%s: cannot open: %s", path, kvp_fileio_strerror(rc));
        return rc;
    }
    int rc;
    struct stat st;
    uint8_t hdr[HEADER_V4_BYTES], tail[CHECKSUM_BYTES];
    uint8_t *caps_block = NULL;   /* the per-layer caps as read (flag bit 2) */
    int n_layers, n_kv_heads;
    kvp_agent_arch a;
    if (fstat(fileno(f), &st) != 0) {
        rc = -errno;
        kvp_errorf(err, errlen, 0, "%s: %s", path, strerror(errno));
        goto fail;
    }
    if (!S_ISREG(st.st_mode)) {
        kvp_errorf(err, errlen, 0, "%s: not a regular file", path);
        rc = -EINVAL;
        goto fail;
    }
    if (st.st_size < HEADER_V1_BYTES) {
        kvp_errorf(err, errlen, 0, "%s: truncated: %lld bytes, the header alone is %d", path,
               (long long)st.st_size, HEADER_V1_BYTES);
        rc = -EINVAL;
        goto fail;
    }
    int header_bytes, calibrated;
    if (fread(hdr, 1, HEADER_V1_BYTES, f) != HEADER_V1_BYTES) {
        kvp_errorf(err, errlen, 0, "%s: read error", path);
        rc = -EIO;
        goto fail;
    }
    if ((rc = parse_header(hdr, (uint64_t)st.st_size, path, &n_layers, &n_kv_heads, &a,
                           &header_bytes, &calibrated, err, errlen)))
        goto fail;
    if (fread(hdr + HEADER_V1_BYTES, 1, (size_t)header_bytes - HEADER_V1_BYTES, f) !=
        (size_t)header_bytes - HEADER_V1_BYTES) {
        kvp_errorf(err, errlen, 0, "%s: read error", path);
        rc = -EIO;
        goto fail;
    }
    int v4 = header_bytes == HEADER_V4_BYTES;
    uint8_t rope_block[ROPE_BYTES + 4 * KVP_AGENT_MAX_D / 2];
    size_t rope_bytes = 0, caps_bytes = 0;
    int has_caps = 0;
    if (v4) {
        uint32_t flags = kvp_get_u32(hdr + HEADER_BYTES);
        if (flags & ~INPUT_KNOWN) {
            kvp_errorf(err, errlen, 0, "%s: unknown input flags %#x (this build knows %#x)",
                       path, flags, INPUT_KNOWN);
            rc = -EINVAL;
            goto fail;
        }
        a.centered = (flags & INPUT_CENTERED) != 0;
        a.relative = (flags & INPUT_RELATIVE) != 0;
        has_caps = (flags & INPUT_CAPS) != 0;
    }
    if (a.relative) {   /* the rotation block: its fixed part, then the factors it counts */
        if ((uint64_t)st.st_size < (uint64_t)header_bytes + ROPE_BYTES + CHECKSUM_BYTES ||
            fread(rope_block, 1, ROPE_BYTES, f) != ROPE_BYTES) {
            kvp_errorf(err, errlen, 0, "%s: truncated: the RoPE block of relative keys is missing",
                       path);
            rc = -EINVAL;
            goto fail;
        }
        uint32_t n_rot = kvp_get_u32(rope_block), nf = kvp_get_u32(rope_block + 12);
        if (n_rot > (uint32_t)a.d || (nf != 0 && nf != n_rot / 2)) {
            kvp_errorf(err, errlen, 0, "%s: RoPE block of %u rotated dims and %u factors does "
                       "not fit head_dim %d (n_rot <= head_dim, factors 0 or n_rot / 2)",
                       path, n_rot, nf, a.d);
            rc = -EINVAL;
            goto fail;
        }
        rope_bytes = ROPE_BYTES + (size_t)nf * 4u;
        if ((uint64_t)st.st_size < (uint64_t)header_bytes + rope_bytes + CHECKSUM_BYTES ||
            fread(rope_block + ROPE_BYTES, 4, nf, f) != nf) {
            kvp_errorf(err, errlen, 0, "%s: truncated in the RoPE block", path);
            rc = -EINVAL;
            goto fail;
        }
    }
    if (has_caps) {   /* u32 n_budgets, u32 budgets[n_budgets], u32 caps[n_layers][n_budgets] */
        uint8_t nb4[4];
        uint64_t at = (uint64_t)header_bytes + rope_bytes;
        if ((uint64_t)st.st_size < at + 4 + CHECKSUM_BYTES || fread(nb4, 1, 4, f) != 4) {
            kvp_errorf(err, errlen, 0, "%s: truncated: the caps block is missing", path);
            rc = -EINVAL;
            goto fail;
        }
        uint32_t nb = kvp_get_u32(nb4);
        if (nb < 1 || nb > KVP_AGENT_MAX_CAP_BUDGETS) {
            kvp_errorf(err, errlen, 0, "%s: caps at %u budgets (1..%d are allowed)", path, nb,
                       KVP_AGENT_MAX_CAP_BUDGETS);
            rc = -EINVAL;
            goto fail;
        }
        caps_bytes = 4u * (1u + nb + (size_t)n_layers * nb);
        if ((uint64_t)st.st_size < at + caps_bytes + CHECKSUM_BYTES) {
            kvp_errorf(err, errlen, 0, "%s: truncated in the caps block", path);
            rc = -EINVAL;
            goto fail;
        }
        if (!(caps_block = malloc(caps_bytes))) {
            kvp_errorf(err, errlen, 0, "%s: out of memory", path);
            rc = -ENOMEM;
            goto fail;
        }
        memcpy(caps_block, nb4, 4);
        if (fread(caps_block + 4, 1, caps_bytes - 4, f) != caps_bytes - 4) {
            kvp_errorf(err, errlen, 0, "%s: read error", path);
            rc = -EIO;
            goto fail;
        }
    }
    if ((rc = check_size((uint64_t)st.st_size, n_layers, n_kv_heads, &a,
                         (uint64_t)header_bytes + rope_bytes + caps_bytes, calibrated, path,
                         err, errlen)))
        goto fail;
    if ((rc = kvp_agent_set_alloc(s, n_layers, n_kv_heads, &a, err, errlen)))
        goto fail;
    if (a.relative) {
        float base, factors[KVP_AGENT_MAX_D / 2];
        uint32_t nf = kvp_get_u32(rope_block + 12);
        memcpy(&base, rope_block + 8, 4);
        memcpy(factors, rope_block + ROPE_BYTES, (size_t)nf * 4u);
        kvp_rope r = {.n_rot = (int)kvp_get_u32(rope_block), .neox = (int)kvp_get_u32(rope_block + 4),
                      .base = base, .factors = nf ? factors : NULL};
        char msg[256];
        if ((rc = kvp_agent_set_rope(s, &r, msg, sizeof msg))) {
            kvp_errorf(err, errlen, 0, "%s: %s", path, msg);
            goto fail;
        }
    }
    if (has_caps) {
        int nb = (int)kvp_get_u32(caps_block), budgets[KVP_AGENT_MAX_CAP_BUDGETS];
        int *caps = malloc((size_t)n_layers * nb * sizeof *caps);
        if (!caps) {
            kvp_errorf(err, errlen, 0, "%s: out of memory", path);
            rc = -ENOMEM;
            goto fail;
        }
        /* values past the int range read as -1, which kvp_agent_set_caps refuses */
        for (int b = 0; b < nb; b++) {
            uint32_t v = kvp_get_u32(caps_block + 4 + 4 * (size_t)b);
            budgets[b] = v > (uint32_t)KVP_AGENT_MAX_CAP ? -1 : (int)v;
        }
        for (size_t i = 0; i < (size_t)n_layers * nb; i++) {
            uint32_t v = kvp_get_u32(caps_block + 4 * (1 + (size_t)nb + i));
            caps[i] = v > (uint32_t)KVP_AGENT_MAX_CAP ? -1 : (int)v;
        }
        char msg[256];
        rc = kvp_agent_set_caps(s, nb, budgets, caps, msg, sizeof msg);
        free(caps);
        if (rc) {
            kvp_errorf(err, errlen, 0, "%s: %s", path, msg);
            goto fail;
        }
    }

    size_t nf = (size_t)n_layers * (size_t)n_kv_heads * s->n_params;
    if (fread(s->params, sizeof(float), nf, f) != nf) {
        kvp_errorf(err, errlen, 0, "%s: read error (file changed while reading?)", path);
        rc = -EIO;
        goto fail;
    }
    uint64_t sum = kvp_fnv1a(kvp_fnv1a(KVP_FNV1A_INIT, hdr, (size_t)header_bytes),
                             rope_block, rope_bytes);
    if (caps_bytes)
        sum = kvp_fnv1a(sum, caps_block, caps_bytes);
    sum = kvp_fnv1a(sum, s->params, nf * sizeof(float));
    if (calibrated &&
        (rc = read_calibration(s, f, (uint64_t)st.st_size,
                               header_bytes + (int)rope_bytes + (int)caps_bytes, v4,
                               &sum, path, err, errlen)))
        goto fail;
    if (fread(tail, 1, sizeof tail, f) != sizeof tail) {
        kvp_errorf(err, errlen, 0, "%s: read error (file changed while reading?)", path);
        rc = -EIO;
        goto fail;
    }
    if (sum != kvp_get_u64(tail)) {
        kvp_errorf(err, errlen, 0, "%s: checksum mismatch (file %016llx, computed %016llx): corrupt",
               path, (unsigned long long)kvp_get_u64(tail), (unsigned long long)sum);
        rc = -EBADMSG;
        goto fail;
    }
    if (header_bytes >= HEADER_BYTES) {
        s->model_fingerprint = kvp_get_u64(hdr + 48);
        memcpy(s->model_name, hdr + 56, KVP_POLICY_MODEL_NAME);
        s->model_name[KVP_POLICY_MODEL_NAME - 1] = 0;
    }
    if ((rc = check_params(s, path, err, errlen)) ||
        (rc = check_calibration(s, path, err, errlen)) ||
        (cfg && (rc = kvp_agent_set_check_model(s, cfg, path, err, errlen))))
        goto fail;
    free(caps_block);
    fclose(f);
    return 0;
fail:
    kvp_agent_set_free(s);
    free(caps_block);
    fclose(f);
    return rc;
}
