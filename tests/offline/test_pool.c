/* offline/pool: every job runs once, on a worker id in range; the first failure stops it. */
#include <criterion/criterion.h>
#include <stdatomic.h>

#include "offline/pool.h"

typedef struct {
    atomic_int runs[1000];
    atomic_int bad_worker, started;
    int threads, fail_at;
} ctx;

static int job(void *arg, int worker, int j)
{
    ctx *c = arg;
    atomic_fetch_add(&c->started, 1);
    if (worker < 0 || worker >= c->threads)
        atomic_store(&c->bad_worker, 1);
    atomic_fetch_add(&c->runs[j], 1);
    return j == c->fail_at ? -7 : 0;
}

Test(pool, every_job_runs_once_on_a_worker_in_range)
{
    for (int threads = 1; threads <= 4; threads++) {
        static ctx c;
        memset(&c, 0, sizeof c);
        c.threads = threads;
        c.fail_at = -1;
        cr_assert_eq(kvp_pool_run(threads, 1000, job, &c), 0);
        for (int j = 0; j < 1000; j++)
            cr_assert_eq(atomic_load(&c.runs[j]), 1, "job %d ran %d times on %d threads", j,
                         atomic_load(&c.runs[j]), threads);
        cr_assert_eq(atomic_load(&c.bad_worker), 0);
    }
}

Test(pool, the_first_failure_is_returned_and_no_new_job_starts_after_it)
{
    static ctx c;
    memset(&c, 0, sizeof c);
    c.threads = 1;
    c.fail_at = 10;
    cr_assert_eq(kvp_pool_run(1, 1000, job, &c), -7);
    cr_assert_eq(atomic_load(&c.started), 11, "one thread: jobs 0..10, then it stops");
    memset(&c, 0, sizeof c);
    c.threads = 3;
    c.fail_at = 10;
    cr_assert_eq(kvp_pool_run(3, 1000, job, &c), -7);
    cr_assert_lt(atomic_load(&c.started), 1000);
}

Test(pool, no_jobs_and_more_threads_than_jobs)
{
    static ctx c;
    memset(&c, 0, sizeof c);
    c.threads = 8;
    c.fail_at = -1;
    cr_assert_eq(kvp_pool_run(8, 0, job, &c), 0);
    cr_assert_eq(atomic_load(&c.started), 0);
    cr_assert_eq(kvp_pool_run(8, 3, job, &c), 0);
    cr_assert_eq(atomic_load(&c.started), 3);
    cr_assert_eq(atomic_load(&c.bad_worker), 0);
}
