/* The OpenAI API's error table (web/oai_error.h). */
#include "web/oai_error.h"

#include <stddef.h>
#include <stdio.h>
#include <string.h>

#include "sessions/hub.h"

static const struct {
    int status;
    const char *type;
    const char *name;   /* the body's code (NULL: null) */
    const char *hub;    /* the hub's code it answers (NULL: none) */
} table[KVPD_OAI_E_COUNT] = {
    [KVPD_OAI_E_INVALID_REQUEST] = {400, "invalid_request_error", NULL, NULL},
    [KVPD_OAI_E_INVALID_JSON] = {400, "invalid_request_error", "invalid_json", NULL},
    [KVPD_OAI_E_UNSUPPORTED_PARAMETER] = {400, "invalid_request_error", "unsupported_parameter",
                                          NULL},
    [KVPD_OAI_E_UNKNOWN_PARAMETER] = {400, "invalid_request_error", "unknown_parameter", NULL},
    [KVPD_OAI_E_UNSUPPORTED_MODEL] = {400, "invalid_request_error", "unsupported_model", NULL},
    [KVPD_OAI_E_PREVIOUS_RESPONSE] = {400, "invalid_request_error",
                                      "previous_response_not_found", NULL},
    [KVPD_OAI_E_CONTEXT_LENGTH] = {400, "invalid_request_error", "context_length_exceeded",
                                   KVPD_E_TOO_LARGE},
    [KVPD_OAI_E_BAD_REQUEST] = {400, "invalid_request_error", KVPD_E_BAD_REQUEST,
                                KVPD_E_BAD_REQUEST},
    [KVPD_OAI_E_UNKNOWN_SESSION] = {400, "invalid_request_error", KVPD_E_UNKNOWN_SESSION,
                                    KVPD_E_UNKNOWN_SESSION},
    [KVPD_OAI_E_INVALID_API_KEY] = {401, "authentication_error", "invalid_api_key", NULL},
    [KVPD_OAI_E_NOT_FOUND] = {404, "not_found_error", "not_found", NULL},
    [KVPD_OAI_E_MODEL_NOT_FOUND] = {404, "not_found_error", "model_not_found", NULL},
    [KVPD_OAI_E_UNKNOWN_URL] = {404, "not_found_error", "unknown_url", NULL},
    [KVPD_OAI_E_METHOD_NOT_ALLOWED] = {405, "invalid_request_error", "method_not_allowed", NULL},
    [KVPD_OAI_E_REQUEST_TOO_LARGE] = {413, "invalid_request_error", "request_too_large", NULL},
    [KVPD_OAI_E_OVERLOADED] = {429, "rate_limit_error", KVPD_E_OVERLOADED, KVPD_E_OVERLOADED},
    [KVPD_OAI_E_BUSY] = {429, "rate_limit_error", KVPD_E_BUSY, KVPD_E_BUSY},
    [KVPD_OAI_E_OVERLOADED_DRAINING] = {503, "service_unavailable", KVPD_E_OVERLOADED, NULL},
    [KVPD_OAI_E_BUSY_DRAINING] = {503, "service_unavailable", KVPD_E_BUSY, NULL},
    [KVPD_OAI_E_SERVER] = {500, "server_error", NULL, NULL},
    [KVPD_OAI_E_INTERNAL] = {500, "server_error", KVPD_E_INTERNAL, KVPD_E_INTERNAL},
    [KVPD_OAI_E_BAD_JSON] = {500, "server_error", KVPD_E_BAD_JSON, KVPD_E_BAD_JSON},
    [KVPD_OAI_E_UNAVAILABLE] = {503, "service_unavailable", NULL, NULL},
    [KVPD_OAI_E_SHUTTING_DOWN] = {503, "service_unavailable", "server_shutting_down", NULL},
    [KVPD_OAI_E_ELSEWHERE] = {503, "service_unavailable", KVPD_E_ELSEWHERE, KVPD_E_ELSEWHERE},
};

static enum kvpd_oai_code valid(enum kvpd_oai_code code)
{
    return (unsigned)code < KVPD_OAI_E_COUNT ? code : KVPD_OAI_E_SERVER;
}

int kvpd_oai_code_status(enum kvpd_oai_code code)
{
    return table[valid(code)].status;
}

const char *kvpd_oai_code_type(enum kvpd_oai_code code)
{
    return table[valid(code)].type;
}

const char *kvpd_oai_code_name(enum kvpd_oai_code code)
{
    return table[valid(code)].name;
}

const char *kvpd_oai_code_label(enum kvpd_oai_code code)
{
    code = valid(code);
    return table[code].name ? table[code].name : table[code].type;
}

enum kvpd_oai_code kvpd_oai_code_of_hub(const char *hub_code, int draining)
{
    for (int i = 0; hub_code && i < KVPD_OAI_E_COUNT; i++) {
        if (!table[i].hub || strcmp(table[i].hub, hub_code))
            continue;
        if (draining && i == KVPD_OAI_E_OVERLOADED)
            return KVPD_OAI_E_OVERLOADED_DRAINING;
        if (draining && i == KVPD_OAI_E_BUSY)
            return KVPD_OAI_E_BUSY_DRAINING;
        return (enum kvpd_oai_code)i;
    }
    return KVPD_OAI_E_INTERNAL;
}

const char *kvpd_oai_unknown_key(const json_t *obj, const char *const *keys)
{
    const char *key;
    json_t *v;
    json_object_foreach((json_t *)obj, key, v) {
        const char *const *k = keys;
        while (*k && strcmp(*k, key))
            k++;
        if (!*k)
            return key;
    }
    return NULL;
}

void kvpd_oai_unknown_at(char *param, size_t paramlen, char *msg, size_t msglen,
                         const char *at, const char *key)
{
    snprintf(param, paramlen, "%s.%.64s", at, key);
    snprintf(msg, msglen, "unknown parameter '%s': kvpd refuses what it would not honour",
             param);
}
