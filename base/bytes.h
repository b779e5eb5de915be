/* Little-endian encoding: fixed-width integers to and from bytes, and the append / read
 * cursors every file format here uses (cache snapshots, session snapshots, policy files).
 * The writer's buffer is sized by the caller beforehand; the reader checks every read. */
#ifndef KVP_BYTES_H
#define KVP_BYTES_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline void kvp_put_u32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void kvp_put_u64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline uint32_t kvp_get_u32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t kvp_get_u64(const unsigned char *p)
{
    return (uint64_t)kvp_get_u32(p) | (uint64_t)kvp_get_u32(p + 4) << 32;
}

/* Appends into p[0..capacity) where the caller computed the capacity. */
typedef struct kvp_wbuf { unsigned char *p; size_t n; } kvp_wbuf;

static inline void kvp_w_bytes(kvp_wbuf *w, const void *src, size_t n)
{
    if (n)
        memcpy(w->p + w->n, src, n);
    w->n += n;
}

static inline void kvp_w_u32(kvp_wbuf *w, uint32_t v) { kvp_put_u32(w->p + w->n, v); w->n += 4; }
static inline void kvp_w_u64(kvp_wbuf *w, uint64_t v) { kvp_put_u64(w->p + w->n, v); w->n += 8; }

static inline void kvp_w_f32(kvp_wbuf *w, float v)
{
    uint32_t bits;
    memcpy(&bits, &v, 4);
    kvp_w_u32(w, bits);
}

static inline void kvp_w_f64(kvp_wbuf *w, double v)
{
    uint64_t bits;
    memcpy(&bits, &v, 8);
    kvp_w_u64(w, bits);
}

/* Reads from p[off..n); each read returns -1 (and reads nothing) past the end. */
typedef struct kvp_rbuf { const unsigned char *p; size_t n, off; } kvp_rbuf;

static inline int kvp_r_bytes(kvp_rbuf *r, void *dst, size_t n)
{
    if (n > r->n - r->off)
        return -1;
    if (n)
        memcpy(dst, r->p + r->off, n);
    r->off += n;
    return 0;
}

static inline int kvp_r_u32(kvp_rbuf *r, uint32_t *v)
{
    if (4 > r->n - r->off)
        return -1;
    *v = kvp_get_u32(r->p + r->off);
    r->off += 4;
    return 0;
}

static inline int kvp_r_u64(kvp_rbuf *r, uint64_t *v)
{
    if (8 > r->n - r->off)
        return -1;
    *v = kvp_get_u64(r->p + r->off);
    r->off += 8;
    return 0;
}

static inline int kvp_r_f32(kvp_rbuf *r, float *v)
{
    uint32_t bits;
    if (kvp_r_u32(r, &bits))
        return -1;
    memcpy(v, &bits, 4);
    return 0;
}

static inline int kvp_r_f64(kvp_rbuf *r, double *v)
{
    uint64_t bits;
    if (kvp_r_u64(r, &bits))
        return -1;
    memcpy(v, &bits, 8);
    return 0;
}

#endif
