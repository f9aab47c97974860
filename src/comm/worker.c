/*
 * worker.c — the communication worker: one thread per rank that runs collectives (and small
 * functions) in FIFO order while the compute thread goes on computing (DESIGN.md §5, §10).
 *
 * DESIGN (after redis's bio.c). Two threads meet here: the owner (the rank's compute thread,
 * which enqueues, waits and frees) and the worker thread. One mutex protects everything
 * below; jobs run without it.
 *
 *   slots[capacity]  a ring of job descriptions, allocated once at init. Ticket t (1, 2, ...)
 *                    lives in slot (t - 1) % capacity while done < t <= issued.
 *   issued           the last ticket handed out (written by the owner).
 *   done             every ticket <= done has finished or been cancelled (written by the
 *                    worker).
 *   failed_ticket    0, or the first job that failed; later jobs are cancelled, not run.
 *   stopping         set by fs_comm_worker_free; the worker exits once the queue is empty.
 *
 * Who signals whom:
 *   owner  -> worker: cv_work, after adding a job (issued++) and after setting stopping.
 *   worker -> owner:  cv_done, after each job finishes or is cancelled (done++): wakes wait
 *                     and flush; and cv_space, the same moment, for an enqueue blocked on a
 *                     full ring.
 * The worker sleeps on cv_work only when done == issued; the owner sleeps on cv_done only
 * while done < the ticket it waits for, and on cv_space only while the ring is full, so
 * every sleep has a matching signal after the state change that ends it.
 *
 * Shutdown drains: fs_comm_worker_free sets stopping and joins; the worker first runs (or,
 * after a failure, cancels) every job still queued. Draining rather than dropping keeps the
 * ranks in step: a rank that shuts down without waiting still takes part in every collective
 * its peers expect. Abort the communicator first (fs_comm_abort) when the peers are gone;
 * the queued collectives then fail at once.
 */
#include "comm_internal.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct worker_job {
    fs_comm_op op;     /* when fn is NULL */
    fs_comm_job_fn fn; /* else: a function job */
    void *arg;
} worker_job;

struct fs_comm_worker {
    fs_comm *comm;
    fs_mem *mem;
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv_work, cv_done, cv_space;
    worker_job *slots; /* (capacity) */
    uint64_t capacity, issued, done;
    int stopping;
    fs_comm_observer observer; /* read by the worker thread, set while it is idle */
    void *observer_ctx;
    uint64_t schedule_hash, schedule_count; /* fs_comm_worker_schedule; the owner's alone */
    uint64_t failed_ticket;
    fs_status failed_status;
    char failed_msg[768];
};

size_t fs_comm_worker_bytes(int capacity) { return (size_t)capacity * sizeof(worker_job); }

static const char *job_name(const worker_job *j) {
    return j->fn ? "function job" : fs_coll_name(j->op.coll);
}

static void *worker_main(void *p) {
    fs_comm_worker *w = p;
    fs_set_thread_rank(w->comm->rank);
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->done == w->issued && !w->stopping) pthread_cond_wait(&w->cv_work, &w->mu);
        if (w->done == w->issued) break; /* stopping, and nothing left */
        uint64_t t = w->done + 1;
        worker_job job = w->slots[(t - 1) % w->capacity];
        if (!w->failed_ticket) {
            fs_comm_observer observer = w->observer;
            void *observer_ctx = w->observer_ctx;
            pthread_mutex_unlock(&w->mu);
            double t0 = observer ? fs_now() : 0;
            fs_status st = job.fn ? job.fn(job.arg)
                                  : fs_comm_run(job.op.comm ? job.op.comm : w->comm, &job.op);
            if (observer) observer(observer_ctx, job.fn ? NULL : &job.op, job.arg, t0, fs_now());
            pthread_mutex_lock(&w->mu);
            if (st != FS_OK) {
                w->failed_ticket = t;
                w->failed_status = st;
                snprintf(w->failed_msg, sizeof w->failed_msg, "job %llu (%s): %s",
                         (unsigned long long)t, job_name(&job), fs_error_message());
            }
        }
        w->done = t;
        pthread_cond_broadcast(&w->cv_done);
        pthread_cond_signal(&w->cv_space);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

fs_status fs_comm_worker_init(fs_comm *comm, int capacity, fs_comm_worker **out) {
    if (!out) return fs_errorf(FS_ERR_USAGE, "fs_comm_worker_init: out is NULL");
    *out = NULL;
    if (!comm) return fs_errorf(FS_ERR_USAGE, "fs_comm_worker_init: comm is NULL");
    if (capacity < 1 || capacity > 65536)
        return fs_errorf(FS_ERR_USAGE, "fs_comm_worker_init: capacity %d is out of range (1 to "
                                       "65536)", capacity);
    fs_comm_worker *w = calloc(1, sizeof *w);
    if (!w) return fs_errorf(FS_ERR_NOMEM, "cannot allocate a communication worker");
    w->comm = comm;
    w->mem = comm->mem;
    w->capacity = (uint64_t)capacity;
    w->schedule_hash = FS_FNV1A_BASIS;
    void *slots = NULL;
    fs_status st = fs_mem_alloc(w->mem, FS_MEM_COMM, (size_t)capacity * sizeof(worker_job),
                                "comm worker queue", &slots);
    if (st != FS_OK) {
        free(w);
        return st;
    }
    w->slots = slots;
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv_work, NULL);
    pthread_cond_init(&w->cv_done, NULL);
    pthread_cond_init(&w->cv_space, NULL);
    if (pthread_create(&w->thread, NULL, worker_main, w) != 0) {
        pthread_cond_destroy(&w->cv_work);
        pthread_cond_destroy(&w->cv_done);
        pthread_cond_destroy(&w->cv_space);
        pthread_mutex_destroy(&w->mu);
        fs_mem_release(w->mem, w->slots);
        free(w);
        return fs_errorf(FS_ERR_NOMEM, "cannot start the communication worker thread");
    }
    *out = w;
    return FS_OK;
}

static fs_status enqueue(fs_comm_worker *w, const worker_job *job, uint64_t *ticket) {
    pthread_mutex_lock(&w->mu);
    while (w->issued - w->done >= w->capacity) pthread_cond_wait(&w->cv_space, &w->mu);
    uint64_t t = ++w->issued;
    w->slots[(t - 1) % w->capacity] = *job;
    pthread_cond_signal(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
    if (ticket) *ticket = t;
    return FS_OK;
}

/* FNV-1a, 64 bits, over the fields of op that every rank must agree on (its buffers may
 * differ) and its tag. Cheap — a few dozen multiplies per collective — so it is always on. */
static uint64_t schedule_mix(uint64_t h, const fs_comm_op *op) {
    const int64_t fields[] = {op->coll, op->tag, (int64_t)op->count, op->dtype, op->recv_dtype,
                              op->op, op->root, op->accumulate, op->algo};
    h = fs_fnv1a(h, fields, sizeof fields);
    if (op->comm) { /* which communicator, as far as every rank can name it alike */
        const int64_t world = fs_comm_world(op->comm) + 1;
        h = fs_fnv1a(h, &world, sizeof world);
    }
    return h;
}

fs_status fs_comm_worker_enqueue(fs_comm_worker *w, const fs_comm_op *op, uint64_t *ticket) {
    if (!w || !op) return fs_errorf(FS_ERR_USAGE, "fs_comm_worker_enqueue: NULL worker or op");
    w->schedule_hash = schedule_mix(w->schedule_hash, op);
    w->schedule_count++;
    worker_job job = {.op = *op};
    return enqueue(w, &job, ticket);
}

void fs_comm_worker_note(fs_comm_worker *w, const fs_comm_op *op) {
    w->schedule_hash = schedule_mix(w->schedule_hash, op);
    w->schedule_count++;
}

fs_status fs_comm_worker_enqueue_fn(fs_comm_worker *w, fs_comm_job_fn fn, void *arg,
                                    uint64_t *ticket) {
    if (!w || !fn)
        return fs_errorf(FS_ERR_USAGE, "fs_comm_worker_enqueue_fn: NULL worker or function");
    worker_job job = {.fn = fn, .arg = arg};
    return enqueue(w, &job, ticket);
}

fs_status fs_comm_worker_wait(fs_comm_worker *w, uint64_t ticket) {
    if (!w) return fs_errorf(FS_ERR_USAGE, "fs_comm_worker_wait: worker is NULL");
    pthread_mutex_lock(&w->mu);
    if (ticket == 0 || ticket > w->issued) {
        uint64_t issued = w->issued;
        pthread_mutex_unlock(&w->mu);
        return fs_errorf(FS_ERR_USAGE, "fs_comm_worker_wait: ticket %llu was never issued (last "
                                       "is %llu)",
                         (unsigned long long)ticket, (unsigned long long)issued);
    }
    while (w->done < ticket) pthread_cond_wait(&w->cv_done, &w->mu);
    fs_status st = FS_OK;
    if (w->failed_ticket && ticket == w->failed_ticket)
        st = fs_errorf(w->failed_status, "%s", w->failed_msg);
    else if (w->failed_ticket && ticket > w->failed_ticket)
        st = fs_errorf(FS_ERR_INTERNAL, "job %llu cancelled: an earlier %s",
                       (unsigned long long)ticket, w->failed_msg);
    pthread_mutex_unlock(&w->mu);
    return st;
}

fs_status fs_comm_worker_flush(fs_comm_worker *w) {
    if (!w) return fs_errorf(FS_ERR_USAGE, "fs_comm_worker_flush: worker is NULL");
    pthread_mutex_lock(&w->mu);
    uint64_t last = w->issued;
    while (w->done < last) pthread_cond_wait(&w->cv_done, &w->mu);
    fs_status st = FS_OK;
    if (w->failed_ticket) st = fs_errorf(w->failed_status, "%s", w->failed_msg);
    pthread_mutex_unlock(&w->mu);
    return st;
}

void fs_comm_worker_free(fs_comm_worker *w) {
    if (!w) return;
    pthread_mutex_lock(&w->mu);
    w->stopping = 1;
    pthread_cond_signal(&w->cv_work);
    pthread_mutex_unlock(&w->mu);
    pthread_join(w->thread, NULL);
    pthread_cond_destroy(&w->cv_work);
    pthread_cond_destroy(&w->cv_done);
    pthread_cond_destroy(&w->cv_space);
    pthread_mutex_destroy(&w->mu);
    fs_mem_release(w->mem, w->slots);
    free(w);
}

void fs_comm_worker_schedule(const fs_comm_worker *w, uint64_t *hash, uint64_t *count) {
    *hash = w->schedule_hash;
    *count = w->schedule_count;
}

void fs_comm_worker_observe(fs_comm_worker *w, fs_comm_observer fn, void *ctx) {
    pthread_mutex_lock(&w->mu);
    w->observer = fn;
    w->observer_ctx = ctx;
    pthread_mutex_unlock(&w->mu);
}
