/*
 * flatshard/trace.h — a timeline of compute and communication, per rank.
 *
 * Two fixed buffers per rank, filled without locks: the compute track (written by the rank's
 * compute thread: each op's forward and backward, the time it waited for a unit, the
 * optimizer step, the whole step) and the communication track (written by its communication
 * worker: every collective with its bytes, and the worker's copy jobs). Events are recorded
 * only for the steps asked for, into buffers allocated before the first step; when a buffer
 * is full, later events are counted as dropped, never allocated.
 *
 * fs_trace_write_json writes every rank's events as a Chrome Trace Event file (Perfetto and
 * chrome://tracing open it): process = rank, thread 0 = compute, thread 1 = communication,
 * complete ("X") events in microseconds since the traced run's start, with the unit and the
 * bytes in "args". `flatshard trace-svg` draws one step of it, read back with
 * fs_trace_read_json.
 */
#ifndef FLATSHARD_TRACE_H
#define FLATSHARD_TRACE_H

#include <stdint.h>

#include "flatshard/core.h"
#include "flatshard/model.h"

typedef enum fs_trace_kind {
    FS_TRACE_STEP,           /* compute track: one optimizer step */
    FS_TRACE_FORWARD,        /* an op's forward */
    FS_TRACE_BACKWARD,       /* an op's backward (with any recomputation) */
    FS_TRACE_WAIT,           /* waiting for a unit's weights or a gradient buffer */
    FS_TRACE_OPTIMIZER,      /* reductions after backward, clipping, AdamW, refresh */
    FS_TRACE_ALL_GATHER,     /* communication track */
    FS_TRACE_REDUCE_SCATTER,
    FS_TRACE_ALL_REDUCE,
    FS_TRACE_BROADCAST,
    FS_TRACE_BARRIER,
    FS_TRACE_COPY,           /* a worker job that is not a collective */
    FS_TRACE_N_KINDS
} fs_trace_kind;

const char *fs_trace_kind_name(fs_trace_kind kind); /* "forward", "all_gather", ... */

typedef struct fs_trace_event {
    double ts, dur;   /* seconds since the trace's origin */
    int32_t kind;     /* fs_trace_kind */
    int32_t unit;     /* the unit, -1 if none */
    int32_t op;       /* the op, -1 if none */
    int32_t step;     /* the optimizer step (1-based) */
    int64_t bytes;    /* collectives: the size of the buffer moved or reduced */
} fs_trace_event;

typedef struct fs_trace {
    fs_trace_event *events;
    int64_t n, cap, dropped;
    double origin;    /* fs_now() at the trace's time zero */
    int recording;    /* set between steps only (the worker is idle then) */
    int32_t step;
} fs_trace;

/* Allocates room for `capacity` events (FS_MEM_OTHER). */
fs_status fs_trace_init(fs_trace *t, int64_t capacity, fs_mem *mem);
void fs_trace_free(fs_trace *t, fs_mem *mem); /* idempotent */

/* Records [t0, t1] (fs_now() times) when recording; counts it as dropped when full. */
void fs_trace_add(fs_trace *t, fs_trace_kind kind, int unit, int op, int64_t bytes, double t0,
                  double t1);

/* Writes a Chrome Trace Event JSON file of n events of `world` ranks: ev_rank[i] says whose
 * event i is, ev_track[i] which track (0 compute, 1 communication). Units are named from the
 * layout ("block 3", "embedding", "lm_head chunk 1", "norm group"). Written to "<path>.<id>.tmp"
 * and renamed. */
fs_status fs_trace_write_json(const char *path, const fs_trace_event *events,
                              const int32_t *ev_rank, const int32_t *ev_track, int64_t n,
                              int world, const fs_layout *layout);

/* "block 3", "embedding", ... for a unit (buf of n bytes). */
void fs_trace_unit_name(const fs_layout *layout, int unit, char *buf, size_t n);

/* ------------------------------------------------------------------ reading (trace-svg) */

#define FS_TRACE_MAX_RANKS 65536 /* pid of an event read back: [0, this) */
#define FS_TRACE_MAX_US 1e15     /* |ts| and dur read back, in microseconds (31 years) */

/* One flatshard event of a timeline file read back ("X" events with args.step and
 * args.kind; "step" events included). */
typedef struct fs_trace_box {
    int rank, track;         /* pid, tid (0 compute, 1 communication) */
    int64_t step;            /* >= 1 */
    double ts_us, dur_us;    /* finite, |ts| and dur <= FS_TRACE_MAX_US, dur >= 0 */
    double bytes;            /* args.bytes, 0 when absent */
    const char *kind, *name; /* into the parsed document (root) */
} fs_trace_box;

typedef struct fs_trace_file {
    void *root;              /* the parsed JSON document, which kind and name point into */
    fs_trace_box *boxes;     /* (n_boxes) in file order */
    int64_t n_boxes;
    int world;               /* 1 + the largest rank, 0 when there are no boxes */
    int64_t first_step, last_step; /* over the boxes; 0 when there are none */
} fs_trace_file;

/* Parses a Chrome Trace Event file's text (n bytes; origin names it in errors). Events that
 * are not flatshard's are skipped; a flatshard event with a missing, mistyped or
 * out-of-range field is a format error naming its index and field. On error *out holds
 * nothing. */
fs_status fs_trace_read_json(fs_trace_file *out, const char *text, size_t n, const char *origin);
void fs_trace_file_free(fs_trace_file *t); /* idempotent; NULL is a no-op */

#endif /* FLATSHARD_TRACE_H */
