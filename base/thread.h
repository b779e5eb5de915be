/* The calling thread's name and scheduling weight. Threads that run background work
 * (the workers' jobs, libuv's pool) are named for `top -H`, `ps -L` and perf, and run
 * at a lower priority than the loop and the batched step, so that on a machine with
 * more runnable threads than cores, rendering a huge prompt or compiling a schema
 * takes the cores the token stream leaves, not the stream's. */
#ifndef KVP_THREAD_H
#define KVP_THREAD_H

/* The nice value background threads run at: a thread at it gets about a tenth of a
 * core that a thread at 0 wants too, and all of one nobody else wants. */
#define KVP_BACKGROUND_NICE 10

/* Names the calling thread (at most 15 bytes are kept). */
void kvp_thread_name(const char *name);
/* Sets the calling thread's nice value to at least `nice` (Linux keeps one per
 * thread); a thread already at it or above is left alone. A thread cannot lower its
 * nice again without privilege, so this is for threads whose every unit of work is
 * background. 0 or a negative errno. */
int kvp_thread_nice(int nice);
/* The calling thread's kernel id (its tid: /proc/self/task/<id>). */
long kvp_thread_self_id(void);
/* The calling thread's nice value. */
int kvp_thread_nice_now(void);

#endif
