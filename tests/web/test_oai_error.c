/* web/oai_error.c: the API's error table and the hub's codes mapped into it. */
#include <criterion/criterion.h>
#include <string.h>

#include "sessions/hub.h"
#include "web/oai_error.h"

Test(oai_error, every_code_has_a_status_and_type)
{
    for (int i = 0; i < KVPD_OAI_E_COUNT; i++) {
        int s = kvpd_oai_code_status((enum kvpd_oai_code)i);
        cr_assert(s >= 400 && s < 600, "code %d: status %d", i, s);
        cr_assert_not_null(kvpd_oai_code_type((enum kvpd_oai_code)i), "code %d", i);
        cr_assert_not_null(kvpd_oai_code_label((enum kvpd_oai_code)i), "code %d", i);
    }
}

Test(oai_error, statuses_types_and_names)
{
    cr_assert_eq(kvpd_oai_code_status(KVPD_OAI_E_INVALID_REQUEST), 400);
    cr_assert_null(kvpd_oai_code_name(KVPD_OAI_E_INVALID_REQUEST));
    cr_assert_str_eq(kvpd_oai_code_label(KVPD_OAI_E_INVALID_REQUEST), "invalid_request_error");
    cr_assert_str_eq(kvpd_oai_code_name(KVPD_OAI_E_INVALID_JSON), "invalid_json");
    cr_assert_eq(kvpd_oai_code_status(KVPD_OAI_E_INVALID_API_KEY), 401);
    cr_assert_str_eq(kvpd_oai_code_type(KVPD_OAI_E_INVALID_API_KEY), "authentication_error");
    cr_assert_eq(kvpd_oai_code_status(KVPD_OAI_E_MODEL_NOT_FOUND), 404);
    cr_assert_str_eq(kvpd_oai_code_type(KVPD_OAI_E_UNKNOWN_URL), "not_found_error");
    cr_assert_eq(kvpd_oai_code_status(KVPD_OAI_E_METHOD_NOT_ALLOWED), 405);
    cr_assert_eq(kvpd_oai_code_status(KVPD_OAI_E_REQUEST_TOO_LARGE), 413);
    cr_assert_str_eq(kvpd_oai_code_type(KVPD_OAI_E_REQUEST_TOO_LARGE), "invalid_request_error");
    cr_assert_eq(kvpd_oai_code_status(KVPD_OAI_E_SERVER), 500);
    cr_assert_str_eq(kvpd_oai_code_label(KVPD_OAI_E_SERVER), "server_error");
    cr_assert_eq(kvpd_oai_code_status(KVPD_OAI_E_UNAVAILABLE), 503);
    cr_assert_str_eq(kvpd_oai_code_label(KVPD_OAI_E_UNAVAILABLE), "service_unavailable");
    cr_assert_str_eq(kvpd_oai_code_name(KVPD_OAI_E_SHUTTING_DOWN), "server_shutting_down");
    /* out of range: the generic server error, never a read past the table */
    cr_assert_eq(kvpd_oai_code_status(KVPD_OAI_E_COUNT), 500);
    cr_assert_eq(kvpd_oai_code_status((enum kvpd_oai_code)-1), 500);
}

Test(oai_error, hub_codes)
{
    cr_assert_eq(kvpd_oai_code_of_hub(KVPD_E_OVERLOADED, 0), KVPD_OAI_E_OVERLOADED);
    cr_assert_eq(kvpd_oai_code_status(kvpd_oai_code_of_hub(KVPD_E_OVERLOADED, 0)), 429);
    cr_assert_str_eq(kvpd_oai_code_type(KVPD_OAI_E_BUSY), "rate_limit_error");
    /* draining: the same code string, answered 503 */
    enum kvpd_oai_code d = kvpd_oai_code_of_hub(KVPD_E_BUSY, 1);
    cr_assert_eq(kvpd_oai_code_status(d), 503);
    cr_assert_str_eq(kvpd_oai_code_name(d), "busy");
    cr_assert_str_eq(kvpd_oai_code_type(d), "service_unavailable");
    cr_assert_str_eq(kvpd_oai_code_name(kvpd_oai_code_of_hub(KVPD_E_OVERLOADED, 1)), "overloaded");
    cr_assert_eq(kvpd_oai_code_status(kvpd_oai_code_of_hub(KVPD_E_OVERLOADED, 1)), 503);
    /* too_large is OpenAI's context_length_exceeded */
    enum kvpd_oai_code t = kvpd_oai_code_of_hub(KVPD_E_TOO_LARGE, 0);
    cr_assert_eq(kvpd_oai_code_status(t), 400);
    cr_assert_str_eq(kvpd_oai_code_name(t), "context_length_exceeded");
    cr_assert_eq(kvpd_oai_code_status(kvpd_oai_code_of_hub(KVPD_E_BAD_REQUEST, 0)), 400);
    cr_assert_eq(kvpd_oai_code_status(kvpd_oai_code_of_hub(KVPD_E_UNKNOWN_SESSION, 0)), 400);
    cr_assert_eq(kvpd_oai_code_status(kvpd_oai_code_of_hub(KVPD_E_ELSEWHERE, 0)), 503);
    cr_assert_str_eq(kvpd_oai_code_name(kvpd_oai_code_of_hub(KVPD_E_ELSEWHERE, 1)), "elsewhere");
    cr_assert_eq(kvpd_oai_code_status(kvpd_oai_code_of_hub(KVPD_E_INTERNAL, 0)), 500);
    /* a code the table does not know, or none: an internal error */
    cr_assert_eq(kvpd_oai_code_of_hub("no_such_code", 0), KVPD_OAI_E_INTERNAL);
    cr_assert_eq(kvpd_oai_code_of_hub("", 0), KVPD_OAI_E_INTERNAL);
    cr_assert_eq(kvpd_oai_code_of_hub(NULL, 0), KVPD_OAI_E_INTERNAL);
    /* only the hub's own codes are looked up, not the API's names */
    cr_assert_eq(kvpd_oai_code_of_hub("context_length_exceeded", 0), KVPD_OAI_E_INTERNAL);
}
