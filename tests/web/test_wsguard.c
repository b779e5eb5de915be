/* web/wsguard.c: the guard of kvpd's accepted connections reads only the loop thread's
 * recv() calls on a connection's own descriptor, and forgets the descriptor when the
 * connection closes. */
#include <criterion/criterion.h>
#include <errno.h>
#include <pthread.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "web/conn.h"

static void pair(int sv[2])
{
    cr_assert_eq(socketpair(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK, 0, sv), 0);
}

static void put(int fd, const char *s)
{
    cr_assert_eq(write(fd, s, strlen(s)), (ssize_t)strlen(s));
}

typedef struct {
    int fd;
    char buf[64];
    ssize_t n;
} worker_read;

static void *worker(void *arg)
{
    worker_read *r = arg;
    r->n = recv(r->fd, r->buf, sizeof r->buf, 0);
    return NULL;
}

Test(wsguard, the_loop_thread_is_guarded_a_worker_is_not)
{
    cr_assert_eq(kvpd_wsguard_init(), 0);   /* this thread is the loop */
    cr_assert_eq(kvpd_wsguard_check(), 0);  /* and recv() is the guard's */
    int sv[2];
    pair(sv);
    kvpd_wsguard *g;
    cr_assert_eq(kvpd_wsguard_accept(sv[0], &g), 0);
    cr_assert_not_null(g);
    /* HTTP: the loop's read ends at the header's empty line */
    put(sv[1], "GET / HTTP/1.1\r\n\r\nnext");
    char buf[64];
    cr_assert_eq(recv(sv[0], buf, sizeof buf, 0), 18);
    /* after the header of a request with no body, the rest is held from the loop ... */
    kvpd_wsguard_body(sv[0], 0);
    errno = 0;
    cr_assert_eq(recv(sv[0], buf, sizeof buf, 0), -1);
    cr_assert_eq(errno, EAGAIN);
    /* ... while a worker thread's recv() on the same descriptor is the system call's */
    put(sv[1], "from a worker\r\n\r\nmore");
    worker_read r = {.fd = sv[0]};
    pthread_t t;
    cr_assert_eq(pthread_create(&t, NULL, worker, &r), 0);
    pthread_join(t, NULL);
    cr_assert_eq(r.n, (ssize_t)strlen("from a worker\r\n\r\nmore"));
    cr_assert_eq(memcmp(r.buf, "from a worker\r\n\r\nmore", (size_t)r.n), 0);
    /* "next" was a pipelined request: known before the answer's headers go out */
    cr_assert_eq(kvpd_wsguard_pipelined(sv[0]), 1);
    cr_assert_eq(kvpd_wsguard_release(sv[0]), 1);
    kvpd_wsguard_close(g);
    close(sv[0]);
    close(sv[1]);
    kvpd_wsguard_free();
}

Test(wsguard, a_closed_connections_descriptor_is_forgotten)
{
    cr_assert_eq(kvpd_wsguard_init(), 0);
    int sv[2];
    pair(sv);
    kvpd_wsguard *g;
    cr_assert_eq(kvpd_wsguard_accept(sv[0], &g), 0);
    kvpd_wsguard_body(sv[0], 0);   /* held: the loop's reads are dropped */
    int fd = sv[0];
    kvpd_wsguard_close(g);
    close(sv[0]);
    close(sv[1]);
    /* the same number again, not a connection's: untouched, header end or not */
    pair(sv);
    cr_assert_eq(sv[0], fd, "the descriptor number was not reused");
    put(sv[1], "A\r\n\r\nB");
    char buf[16];
    cr_assert_eq(recv(sv[0], buf, sizeof buf, 0), 6);
    cr_assert_eq(kvpd_wsguard_failed(sv[0]), 0);
    cr_assert_eq(kvpd_wsguard_release(sv[0]), 0);
    close(sv[0]);
    close(sv[1]);
    kvpd_wsguard_free();
}

Test(wsguard, a_stale_state_does_not_clear_a_new_one)
{
    cr_assert_eq(kvpd_wsguard_init(), 0);
    int sv[2];
    pair(sv);
    kvpd_wsguard *old, *cur;
    cr_assert_eq(kvpd_wsguard_accept(sv[0], &old), 0);
    /* the number accepted again before the old connection's close came */
    cr_assert_eq(kvpd_wsguard_accept(sv[0], &cur), 0);
    kvpd_wsguard_close(old);
    put(sv[1], "GET / HTTP/1.1\n\nrest");   /* still guarded as the new connection's */
    char buf[64];
    cr_assert_eq(recv(sv[0], buf, sizeof buf, 0), 16);
    kvpd_wsguard_close(cur);
    cr_assert_eq(recv(sv[0], buf, sizeof buf, 0), 4);
    kvpd_wsguard_close(NULL);
    close(sv[0]);
    close(sv[1]);
    kvpd_wsguard_free();
}

/* Whether a request came pipelined behind the one being answered is known before the
 * answer's headers go out, read by the loop or still unread in the socket, so the answer
 * can say `Connection: close`; blank lines after a body are not a request. */
Test(wsguard, a_pipelined_request_is_seen_before_the_answer)
{
    cr_assert_eq(kvpd_wsguard_init(), 0);
    int sv[2];
    pair(sv);
    kvpd_wsguard *g;
    cr_assert_eq(kvpd_wsguard_accept(sv[0], &g), 0);
    put(sv[1], "POST / HTTP/1.1\r\nContent-Length: 2\r\n\r\n{}\r\n");
    char buf[128];
    cr_assert_eq(recv(sv[0], buf, sizeof buf, 0), 38);
    kvpd_wsguard_body(sv[0], 2);
    cr_assert_eq(recv(sv[0], buf, sizeof buf, 0), 2);
    cr_assert_eq(kvpd_wsguard_pipelined(sv[0]), 0, "a blank line is no request");
    put(sv[1], "\r\nPOST / HTTP/1.1\r\n");   /* unread by the loop: still in the socket */
    cr_assert_eq(kvpd_wsguard_pipelined(sv[0]), 1);
    cr_assert_eq(kvpd_wsguard_release(sv[0]), 1);
    cr_assert_eq(kvpd_wsguard_pipelined(sv[0]), 0, "not held: nothing is pipelined");
    cr_assert_eq(kvpd_wsguard_pipelined(-1), 0);
    kvpd_wsguard_close(g);
    close(sv[0]);
    close(sv[1]);
    kvpd_wsguard_free();
}

Test(wsguard, descriptors_out_of_range)
{
    cr_assert_eq(kvpd_wsguard_init(), 0);
    kvpd_wsguard *g = (kvpd_wsguard *)1;
    cr_assert_eq(kvpd_wsguard_accept(-1, &g), -EMFILE);
    cr_assert_null(g);
    cr_assert_eq(kvpd_wsguard_accept(1 << 30, &g), -EMFILE);
    cr_assert_eq(kvpd_wsguard_failed(-1), 0);
    cr_assert_eq(kvpd_wsguard_upgraded(-1, NULL), -EINVAL);
    kvpd_wsguard_body(-1, 10);
    cr_assert_eq(kvpd_wsguard_release(1 << 30), 0);
    kvpd_wsguard_free();
    /* without the index (before init, after free), recv() is the system call's */
    int sv[2];
    pair(sv);
    put(sv[1], "x\n\ny");
    char buf[8];
    cr_assert_eq(recv(sv[0], buf, sizeof buf, 0), 4);
    close(sv[0]);
    close(sv[1]);
}
