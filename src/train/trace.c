/*
 * trace.c — timeline buffers and their Chrome Trace Event JSON (contract in trace.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "flatshard/trace.h"

static const char *const kind_names[FS_TRACE_N_KINDS] = {
    [FS_TRACE_STEP] = "step",
    [FS_TRACE_FORWARD] = "forward",
    [FS_TRACE_BACKWARD] = "backward",
    [FS_TRACE_WAIT] = "wait",
    [FS_TRACE_OPTIMIZER] = "optimizer",
    [FS_TRACE_ALL_GATHER] = "all_gather",
    [FS_TRACE_REDUCE_SCATTER] = "reduce_scatter",
    [FS_TRACE_ALL_REDUCE] = "all_reduce",
    [FS_TRACE_BROADCAST] = "broadcast",
    [FS_TRACE_BARRIER] = "barrier",
    [FS_TRACE_COPY] = "copy",
};

const char *fs_trace_kind_name(fs_trace_kind kind) {
    return (int)kind >= 0 && kind < FS_TRACE_N_KINDS ? kind_names[kind] : "invalid";
}

fs_status fs_trace_init(fs_trace *t, int64_t capacity, fs_mem *mem) {
    memset(t, 0, sizeof *t);
    FS_TRY(fs_mem_alloc(mem, FS_MEM_OTHER, (size_t)capacity * sizeof *t->events, "trace events",
                        (void **)&t->events));
    t->cap = capacity;
    t->origin = fs_now();
    return FS_OK;
}

void fs_trace_free(fs_trace *t, fs_mem *mem) {
    if (!t) return;
    fs_mem_release(mem, t->events);
    memset(t, 0, sizeof *t);
}

void fs_trace_add(fs_trace *t, fs_trace_kind kind, int unit, int op, int64_t bytes, double t0,
                  double t1) {
    if (!t || !t->recording) return;
    if (t->n == t->cap) {
        t->dropped++;
        return;
    }
    t->events[t->n++] = (fs_trace_event){.ts = t0 - t->origin, .dur = t1 - t0, .kind = kind,
                                         .unit = unit, .op = op, .step = t->step, .bytes = bytes};
}

void fs_trace_unit_name(const fs_layout *l, int unit, char *buf, size_t n) {
    if (unit < 0 || unit >= l->n_units) {
        snprintf(buf, n, "%s", "");
        return;
    }
    const fs_unit_info *u = &l->units[unit];
    int chunked = u->rows > 0 && u->rows < l->cfg.vocab_size;
    switch (u->kind) {
    case FS_UNIT_NORMS: snprintf(buf, n, "norm group"); break;
    case FS_UNIT_BLOCK: snprintf(buf, n, "block %d", u->index); break;
    case FS_UNIT_EMBED:
        if (chunked) snprintf(buf, n, "embedding chunk %d", u->index);
        else snprintf(buf, n, "embedding");
        break;
    case FS_UNIT_HEAD:
        if (chunked) snprintf(buf, n, "lm_head chunk %d", u->index);
        else snprintf(buf, n, "lm_head");
        break;
    }
}

fs_status fs_trace_write_json(const char *path, const fs_trace_event *ev, const int32_t *ev_rank,
                              const int32_t *ev_track, int64_t n, int world,
                              const fs_layout *layout) {
    char tmp[4096];
    FILE *f = fs_tmp_fopen(path, tmp, sizeof tmp); /* a name of this write's own (core.h) */
    if (!f) return fs_error_wrap(FS_ERR_IO, "--trace %s", path);
    fprintf(f, "{\"displayTimeUnit\":\"ms\",\"otherData\":{\"producer\":\"flatshard\"},\"traceEvents\":[\n");
    for (int r = 0; r < world; r++) {
        /* a comma after each object but the file's last: a run of no steps (--steps 0)
         * writes these alone, and a comma before ']' is not JSON */
        fprintf(f, "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"name\":\"rank %d\"}},\n", r, r);
        fprintf(f, "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,\"args\":{\"sort_index\":%d}},\n", r, r);
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,\"args\":{\"name\":\"compute\"}},\n", r);
        fprintf(f, "{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":1,\"args\":{\"name\":\"communication\"}}%s\n",
                r, r + 1 < world || n > 0 ? "," : "");
    }
    for (int64_t i = 0; i < n; i++) {
        const fs_trace_event *e = &ev[i];
        char unit[64], name[128];
        fs_trace_unit_name(layout, e->unit, unit, sizeof unit);
        if (e->kind == FS_TRACE_STEP) snprintf(name, sizeof name, "step %d", e->step);
        else if (unit[0]) snprintf(name, sizeof name, "%s %s", fs_trace_kind_name((fs_trace_kind)e->kind), unit);
        else snprintf(name, sizeof name, "%s", fs_trace_kind_name((fs_trace_kind)e->kind));
        fprintf(f,
                "{\"name\":\"%s\",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,"
                "\"dur\":%.3f,\"args\":{\"step\":%d,\"kind\":\"%s\",\"unit\":%d,\"op\":%d,\"bytes\":%lld}}%s\n",
                name, ev_track[i] ? "communication" : "compute", ev_rank[i], ev_track[i], e->ts * 1e6,
                e->dur * 1e6, e->step, fs_trace_kind_name((fs_trace_kind)e->kind), e->unit, e->op,
                (long long)e->bytes, i + 1 < n ? "," : "");
    }
    fprintf(f, "]}\n");
    if (fs_fault_value("trace-write-fail")) { /* tests: a full disk at the last write */
        errno = ENOSPC;
        fs_tmp_discard(f, tmp);
    } else if (fs_tmp_commit(f, tmp, path) == 0) {
        return FS_OK;
    } /* fs_tmp_commit keeps the first error of any fprintf above (stdio's ferror) */
    return fs_errorf(FS_ERR_IO, "--trace %s: write failed: %s", path, strerror(errno));
}
