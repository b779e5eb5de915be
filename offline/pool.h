/* The one task pool of the offline work (training, calibration, evaluation): runs
 * job(ctx, worker, j) for j = 0..n_jobs-1 on up to `threads` threads, each taking the next
 * job as it finishes one. Worker ids are 0..threads-1 (the calling thread is worker 0), so
 * a job can use per-worker scratch space. After a job returns nonzero no new job starts;
 * the first nonzero result is returned (0: every job ran). A thread that cannot be
 * started leaves its share to the others. */
#ifndef KVP_OFFLINE_POOL_H
#define KVP_OFFLINE_POOL_H

int kvp_pool_run(int threads, int n_jobs, int (*job)(void *ctx, int worker, int j), void *ctx);

#endif
