/*
 * A fixed pool of pthreads.
 *
 * h3r_pool_run(p, fn, ctx) calls fn(ctx, ith, nth) for every ith in [0, nth),
 * nth = pool size; the caller runs ith 0 and workers run 1..nth-1. It returns
 * when all calls are done. The work a given ith does must be decided by ith
 * and nth alone (never by timing), so results do not depend on scheduling.
 *
 * Synchronisation is one mutex and two condition variables: a generation
 * counter wakes the workers, a pending counter wakes the caller. Workers
 * sleep between runs (the machine is shared; no spinning). A pool runs one
 * job at a time: h3r_pool_run must not be called concurrently or from
 * inside fn on the same pool.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include "internal.h"

#define H3R_MAX_THREADS 256

struct h3r_pool {
    int n;                       /* threads including the caller */
    pthread_t *threads;          /* n - 1 workers */
    int started;                 /* workers successfully created */
    pthread_mutex_t mu;
    pthread_cond_t wake;         /* generation changed or stop */
    pthread_cond_t done;         /* pending reached 0 */
    uint64_t generation;
    int pending;                 /* workers still running the current job */
    int stop;
    void (*fn)(void *ctx, int ith, int nth);
    void *ctx;
};

typedef struct {
    h3r_pool *p;
    int ith;
} worker_arg;

static void *worker_main(void *arg) {
    worker_arg wa = *(worker_arg *)arg;
    free(arg);
    h3r_pool *p = wa.p;
    uint64_t seen = 0;
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->stop && p->generation == seen) pthread_cond_wait(&p->wake, &p->mu);
        if (p->stop) break;
        seen = p->generation;
        void (*fn)(void *, int, int) = p->fn;
        void *ctx = p->ctx;
        pthread_mutex_unlock(&p->mu);
        fn(ctx, wa.ith, p->n);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0) pthread_cond_signal(&p->done);
    }
    pthread_mutex_unlock(&p->mu);
    return NULL;
}

/* The size of a pool asked for n_threads: n_threads <= 0 means one per online
 * CPU; counts are capped at H3R_MAX_THREADS. */
int h3r_pool_threads(int n_threads) {
    if (n_threads <= 0) {
        long c = sysconf(_SC_NPROCESSORS_ONLN);
        n_threads = c > 0 ? (int)(c < H3R_MAX_THREADS ? c : H3R_MAX_THREADS) : 1;
    }
    return n_threads > H3R_MAX_THREADS ? H3R_MAX_THREADS : n_threads;
}

/*
 * Create a pool of h3r_pool_threads(n_threads) threads (including the calling
 * thread). Returns NULL with an error set if threads cannot be created.
 */
h3r_pool *h3r_pool_create(int n_threads) {
    n_threads = h3r_pool_threads(n_threads);
    h3r_pool *p = calloc(1, sizeof(*p));
    if (!p) { h3r_seterr(H3R_ERR_NOMEM, "thread pool: out of memory"); return NULL; }
    p->n = n_threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->wake, NULL);
    pthread_cond_init(&p->done, NULL);
    if (n_threads > 1) {
        p->threads = calloc((size_t)n_threads - 1, sizeof(pthread_t));
        if (!p->threads) {
            h3r_pool_free(p);
            h3r_seterr(H3R_ERR_NOMEM, "thread pool: out of memory");
            return NULL;
        }
    }
    for (int i = 1; i < n_threads; i++) {
        worker_arg *wa = malloc(sizeof(*wa));
        int rc = wa ? 0 : -1;
        if (wa) {
            wa->p = p;
            wa->ith = i;
            rc = pthread_create(&p->threads[i - 1], NULL, worker_main, wa);
            if (rc) free(wa);
        }
        if (rc) {
            h3r_pool_free(p);
            h3r_seterr(H3R_ERR_NOMEM, "thread pool: cannot create thread %d of %d", i, n_threads);
            return NULL;
        }
        p->started = i;
    }
    return p;
}

/* Stop and join the workers, free the pool. NULL is a no-op. */
void h3r_pool_free(h3r_pool *p) {
    if (!p) return;
    pthread_mutex_lock(&p->mu);
    p->stop = 1;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    for (int i = 0; i < p->started; i++) pthread_join(p->threads[i], NULL);
    pthread_cond_destroy(&p->wake);
    pthread_cond_destroy(&p->done);
    pthread_mutex_destroy(&p->mu);
    free(p->threads);
    free(p);
}

/* Threads including the caller; 1 for a NULL pool. */
int h3r_pool_size(const h3r_pool *p) { return p ? p->n : 1; }

/* Run fn on every thread; see the file comment. A NULL pool runs fn(ctx, 0, 1). */
void h3r_pool_run(h3r_pool *p, void (*fn)(void *ctx, int ith, int nth), void *ctx) {
    if (!p || p->n == 1) {
        fn(ctx, 0, 1);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->ctx = ctx;
    p->pending = p->n - 1;
    p->generation++;
    pthread_cond_broadcast(&p->wake);
    pthread_mutex_unlock(&p->mu);
    fn(ctx, 0, p->n);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0) pthread_cond_wait(&p->done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}
