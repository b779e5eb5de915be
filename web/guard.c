/* Who may talk to the daemon: the Host header against the names it serves (DNS
 * rebinding), the Origin header against the origins allowed to drive it (cross-site
 * pages), the websocket version, and the admin token (generated at start when none is
 * configured, so the admin endpoints are never open by default). */
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/checksum.h"
#include "base/fileio.h"
#include "base/log.h"
#include "web/conn.h"

/* The names served when allowed_hosts is empty: loopback, and the listen address. */
static const char *const loopback_names[] = {"localhost", "127.0.0.1", "::1"};

/* 1 when item (n bytes) is in the comma-separated list (spaces around items ignored). */
static int in_list(const char *list, const char *item, size_t n)
{
    for (const char *p = list; *p;) {
        while (*p == ' ' || *p == ',')
            p++;
        const char *e = p;
        while (*e && *e != ',')
            e++;
        const char *t = e;
        while (t > p && t[-1] == ' ')
            t--;
        if ((size_t)(t - p) == n && n && !strncasecmp(p, item, n))
            return 1;
        p = e;
    }
    return 0;
}

static int wildcard(const char *host)
{
    return !strcmp(host, "0.0.0.0") || !strcmp(host, "*") || !strcmp(host, "::");
}

/* 1 when name (n bytes, no port, no brackets) is a name this daemon serves. */
static int host_allowed(const kvpd_web *w, const char *name, size_t n)
{
    const char *list = w->cfg->allowed_hosts;
    if (list[0])
        return !strcmp(list, "*") || in_list(list, name, n);
    for (size_t i = 0; i < sizeof loopback_names / sizeof *loopback_names; i++)
        if (strlen(loopback_names[i]) == n && !strncasecmp(loopback_names[i], name, n))
            return 1;
    const char *listen = w->cfg->listen_host;
    return !wildcard(listen) && strlen(listen) == n && !strncasecmp(listen, name, n);
}

/* "name", "name:port", "[v6]", "[v6]:port" -> name and its length; -1 if malformed. */
static int split_host(const char *h, const char **name, size_t *n)
{
    if (h[0] == '[') {
        const char *close = strchr(h, ']');
        if (!close || (close[1] && close[1] != ':'))
            return -1;
        *name = h + 1;
        *n = (size_t)(close - h - 1);
        return 0;
    }
    const char *colon = strchr(h, ':');
    *name = h;
    *n = colon ? (size_t)(colon - h) : strlen(h);
    return colon && strchr(colon + 1, ':') ? -1 : 0;
}

/* An Origin is allowed when listed, or (allowed_origins empty) when it is this
 * daemon's own: http://<a served name>:<port>. */
static int origin_allowed(const kvpd_web *w, const char *origin)
{
    const char *list = w->cfg->allowed_origins;
    if (list[0])
        return !strcmp(list, "*") || in_list(list, origin, strlen(origin));
    if (strncasecmp(origin, "http://", 7))
        return 0;
    const char *hostport = origin + 7, *name;
    size_t n;
    if (strchr(hostport, '/') || split_host(hostport, &name, &n) < 0)
        return 0;
    const char *after = name[-1] == '[' ? name + n + 1 : name + n;
    long port = 80;
    if (*after == ':') {   /* digits only: "…:8080x" is no origin of ours */
        char *end;
        port = strtol(after + 1, &end, 10);
        if (end == after + 1 || *end || after[1] < '0' || after[1] > '9')
            return 0;
    }
    return port == w->port && host_allowed(w, name, n);
}

const char *kvpd_guard_check(kvpd_web *w, struct lws *wsi, int *status)
{
    char buf[256];
    const char *name;
    size_t n;
    int len = lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_HOST);
    if (len <= 0 || split_host(buf, &name, &n) < 0) {
        *status = 400;
        return "a Host header naming this server is required\n";
    }
    if (!host_allowed(w, name, n)) {
        *status = 421;
        return "this server does not serve that Host (see allowed_hosts)\n";
    }
    len = lws_hdr_copy(wsi, buf, sizeof buf, WSI_TOKEN_ORIGIN);
    if (lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN) > 0 && (len <= 0 || !origin_allowed(w, buf))) {
        *status = 403;
        return "requests from that Origin are not allowed (see allowed_origins)\n";
    }
    return NULL;
}

const char *kvpd_guard_cors(kvpd_web *w, struct lws *wsi, char *buf, size_t len)
{
    const char *list = w->cfg->allowed_origins;
    if (!list[0] || lws_hdr_total_length(wsi, WSI_TOKEN_ORIGIN) <= 0 ||
        lws_hdr_copy(wsi, buf, (int)len, WSI_TOKEN_ORIGIN) <= 0)
        return NULL;
    if (!strcmp(list, "*"))
        return "*";
    return in_list(list, buf, strlen(buf)) ? buf : NULL;
}

const char *kvpd_guard_upgrade(kvpd_web *w, struct lws *wsi, int *status)
{
    const char *why = kvpd_guard_check(w, wsi, status);
    if (why)
        return why;
    char v[16];
    *status = 400;
    if (lws_hdr_copy(wsi, v, sizeof v, WSI_TOKEN_VERSION) <= 0 || strcmp(v, "13"))
        return "Sec-WebSocket-Version must be 13 (RFC 6455)\n";
    return NULL;
}

/* The tenant of key i: 16 hex digits of its hash. */
static void tenant_of(const kvpd_config *cfg, int i, char *tenant)
{
    const char *k = cfg->api_keys[i];
    snprintf(tenant, KVP_TENANT_LEN + 1, "%016llx",
             (unsigned long long)kvp_fnv1a(KVP_FNV1A_INIT, k, strlen(k)));
}

/* The token of the request's "Authorization: Bearer" header in got (cap bytes), "" when
 * it has none (or one too long for got). */
static const char *bearer_token(struct lws *wsi, char *got, int cap)
{
    int n = lws_hdr_copy(wsi, got, cap, WSI_TOKEN_HTTP_AUTHORIZATION);
    return n > 7 && !strncmp(got, "Bearer ", 7) ? got + 7 : "";
}

int kvpd_api_tenant(const kvpd_web *w, struct lws *wsi, char *tenant)
{
    char got[256];
    const char *tok = bearer_token(wsi, got, sizeof got);
    return kvpd_api_tenant_token(w, tok, strlen(tok), tenant);
}

int kvpd_api_tenant_token(const kvpd_web *w, const char *tok, size_t len, char *tenant)
{
    tenant[0] = '\0';
    const kvpd_config *cfg = w->cfg;
    if (!cfg->n_api_keys)
        return 1;
    int found = -1;
    for (int i = 0; i < cfg->n_api_keys; i++)   /* every key compared: no early exit */
        if (kvpd_token_is(tok, len, cfg->api_keys[i]) && found < 0)
            found = i;
    if (found < 0)
        return 0;
    tenant_of(cfg, found, tenant);
    return 1;
}

int kvpd_api_tenant_known(const kvpd_web *w, const char *tenant)
{
    const kvpd_config *cfg = w->cfg;
    if (!cfg->n_api_keys)
        return !tenant[0];
    char t[KVP_TENANT_LEN + 1];
    for (int i = 0; i < cfg->n_api_keys; i++) {
        tenant_of(cfg, i, t);
        if (!strcmp(t, tenant))
            return 1;
    }
    return 0;
}

const char *kvpd_admin_token(const kvpd_web *w)
{
    return w->cfg->admin_token[0] ? w->cfg->admin_token : w->admin_token_generated;
}

int kvpd_admin_token_init(kvpd_web *w, char *err, size_t errlen)
{
    w->admin_token_generated[0] = '\0';
    if (w->cfg->admin_token[0])
        return 0;
    unsigned char raw[16];
    if (getrandom(raw, sizeof raw, 0) != (ssize_t)sizeof raw) {
        snprintf(err, errlen, "admin token: getrandom: %s", strerror(errno));
        return -EIO;
    }
    for (size_t i = 0; i < sizeof raw; i++)
        snprintf(w->admin_token_generated + 2 * i, 3, "%02x", raw[i]);
    char path[KVPD_PATH_MAX + 16];
    if (w->cfg->admin_token_file[0])
        snprintf(path, sizeof path, "%s", w->cfg->admin_token_file);
    else if (w->cfg->state_dir[0])
        snprintf(path, sizeof path, "%s/admin.token", w->cfg->state_dir);
    else {
        kvpd_log("warning", "/admin/* is closed: no admin_token, and no admin_token_file or "
                 "state_dir to write a generated one to");
        return 0;
    }
    /* Only this user may read it: created 0600, never through a link, never someone
     * else's file; an existing file is emptied only once it passed those checks. */
    struct stat st;
    int fd = kvp_open_regular(path, O_WRONLY | O_CREAT, &st);
    int rc = fd == KVP_E_NOT_REGULAR ? -EPERM : fd < 0 ? fd : 0;
    if (!rc && st.st_uid != geteuid())
        rc = -EPERM;
    if (!rc && (fchmod(fd, 0600) < 0 || ftruncate(fd, 0) < 0))
        rc = -errno;
    char line[40];
    int n = snprintf(line, sizeof line, "%s\n", w->admin_token_generated);
    if (!rc && write(fd, line, (size_t)n) != n)
        rc = errno ? -errno : -EIO;
    if (fd >= 0 && close(fd) < 0 && !rc)
        rc = -errno;
    if (rc < 0) {
        snprintf(err, errlen, "admin token file %s: %s", path,
                 rc == -EPERM ? "not a regular file of this user" : strerror(-rc));
        return rc;
    }
    kvpd_log("info", "/admin/* needs the bearer token in %s (mode 0600)", path);
    return 0;
}

int kvpd_token_is(const char *tok, size_t tl, const char *want)
{
    if (!want[0])
        return 0;
    size_t wl = strlen(want);
    unsigned diff = (unsigned)(wl ^ tl);
    for (size_t i = 0; i < wl; i++)
        diff |= (unsigned char)want[i] ^ (unsigned char)(i < tl ? tok[i] : 0);
    return diff == 0;
}

int kvpd_bearer_is(struct lws *wsi, const char *want)
{
    if (!want[0])
        return 0;
    char got[256];
    const char *tok = bearer_token(wsi, got, sizeof got);
    return tok[0] && kvpd_token_is(tok, strlen(tok), want);
}

int kvpd_cors_headers(const char *origin, const char **extra)
{
    if (!origin)
        return 0;
    int k = 0;
    extra[k++] = "access-control-allow-origin:";
    extra[k++] = origin;
    extra[k++] = "vary:";
    extra[k++] = "Origin";
    extra[k++] = "access-control-expose-headers:";
    extra[k++] = "x-session-id, retry-after";
    return k;
}
