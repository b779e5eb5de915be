/* One /chat websocket text message from untrusted bytes (docs/protocol.md). */
#include "tests/fuzz/fuzz.h"
#include "web/protocol.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    kvpd_client_msg m;
    const char *code = NULL;
    char msg[256];
    if (kvpd_proto_parse((const char *)data, size, 256, &m, &code, msg, sizeof msg) == 0)
        kvpd_proto_msg_free(&m);
    return 0;
}
