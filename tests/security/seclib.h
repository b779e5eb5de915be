/* Helpers the daemon security tests share (tests/daemon/harness.h starts the daemon and
 * speaks websocket and HTTP): how a websocket connection ends, a hello's answer, and a
 * chat completion's status, session and reply. */
#ifndef KVP_TESTS_SECLIB_H
#define KVP_TESTS_SECLIB_H

#include <stddef.h>

#include "tests/daemon/harness.h"

/* The close code that ends the connection within timeout_ms (text frames before it are
 * skipped, their types noted in seen when it is not NULL); -1 when it stayed open, 0
 * when it closed without a close frame (or with an empty close payload). The reason
 * goes to why. */
int sec_close_code(ws_client *c, int timeout_ms, char *why, size_t n, char *seen,
                   size_t seen_n);

/* Sends {"type":"hello","session":id} and returns the answer's type, or the error's
 * code when it is an error, in buf. */
const char *sec_hello_answer(ws_client *c, const char *id, char *buf, size_t n);

/* A POST /v1/chat/completions answer: the status, the raw response, the body as JSON
 * (NULL when it is none), the x-session-id header and the first choice's content. */
typedef struct sec_answer {
    int status;
    char *raw;
    json_t *j;
    char session[64];
    char reply[512];
} sec_answer;

sec_answer sec_post(const kvpd_proc *p, const char *headers, const char *body);
void sec_answer_free(sec_answer *a);

/* The conversation the tenant tests continue: its first turn's body, and its second
 * turn's ("Once upon a time", reply, "Then?"; max_tokens 4), naming the session id when
 * id is not NULL (malloc'd). */
#define SEC_FIRST \
    "{\"messages\":[{\"role\":\"user\",\"content\":\"Once upon a time\"}],\"max_tokens\":4}"
char *sec_second_turn(const char *reply, const char *id);

/* Request i of a flood of one-shot conversations under headers ("Story i: a frog.", two
 * tokens), answered 200 (asserted). */
sec_answer sec_flood_post(const kvpd_proc *d, const char *headers, int i);
/* Requests from..to-1 of that flood. */
void sec_flood(const kvpd_proc *d, const char *headers, int from, int to);
/* The conversation whose first answer is first (under headers) goes on: its second turn,
 * naming the session when named, is answered 200 in the same session with cached prompt
 * tokens (named: the answer carries that id; not named: no id, which a new session, even
 * one forked from the cache, would have); `what` says what it shows. */
void sec_assert_resumes(const kvpd_proc *d, const char *headers, const sec_answer *first,
                        int named, const char *what);

#endif
