/* The offline tools' task pool (pool.h). */
#include <pthread.h>
#include <stdatomic.h>

#include "offline/pool.h"

typedef struct pool {
    atomic_int next, rc;
    int n_jobs;
    int (*job)(void *ctx, int worker, int job);
    void *ctx;
} pool;

typedef struct pool_arg {
    pool *p;
    int worker;
} pool_arg;

static void *pool_main(void *arg)
{
    pool_arg *a = arg;
    pool *p = a->p;
    int j;
    while (!atomic_load(&p->rc) && (j = atomic_fetch_add(&p->next, 1)) < p->n_jobs) {
        int rc = p->job(p->ctx, a->worker, j);
        if (rc) {
            int zero = 0;
            atomic_compare_exchange_strong(&p->rc, &zero, rc);
        }
    }
    return NULL;
}

int kvp_pool_run(int threads, int n_jobs, int (*job)(void *, int, int), void *ctx)
{
    pool p = {.n_jobs = n_jobs, .job = job, .ctx = ctx};
    atomic_init(&p.next, 0);
    atomic_init(&p.rc, 0);
    if (threads > n_jobs)
        threads = n_jobs;
    pthread_t tid[threads > 1 ? threads : 1];
    pool_arg args[threads > 1 ? threads : 1];
    int started = 1;
    for (int w = 1; w < threads; w++) {
        args[w] = (pool_arg){&p, w};
        /* a thread that cannot start just leaves its share to the others */
        if (pthread_create(&tid[w], NULL, pool_main, &args[w]))
            break;
        started++;
    }
    args[0] = (pool_arg){&p, 0};
    pool_main(&args[0]);
    for (int w = 1; w < started; w++)
        pthread_join(tid[w], NULL);
    return atomic_load(&p.rc);
}

