/*
 * trace_read.c — reading back a timeline file (contract in trace.h), for trace-svg.
 *
 * The file is untrusted input (any JSON a user points trace-svg at), so every field of a
 * flatshard event is checked before anything is drawn from it: a missing or mistyped field,
 * a rank or time far outside what a run produces, a non-integer step, are format errors
 * naming the event, never a NULL dereference, an out-of-range cast or an endless axis loop
 * downstream. Events that are not flatshard's (metadata "M" events, "X" events without
 * args.step and args.kind, as other tools write) are skipped. tests/fuzz/fuzz_trace_json.c
 * fuzzes this.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "flatshard/trace.h"

void fs_trace_file_free(fs_trace_file *t) {
    if (!t) return;
    cJSON_Delete(t->root);
    free(t->boxes);
    memset(t, 0, sizeof *t);
}

/* A number field of event i within [lo, hi] (and an integer when `integer`). */
static fs_status number_field(const cJSON *obj, const char *key, double lo, double hi, int integer,
                              const char *origin, int64_t i, double *out) {
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, key);
    if (!cJSON_IsNumber(v))
        return fs_errorf(FS_ERR_FORMAT, "%s: traceEvents[%lld]: '%s' is missing or not a number", origin,
                         (long long)i, key);
    const double x = v->valuedouble;
    if (!(x >= lo && x <= hi) || (integer && x != floor(x)))
        return fs_errorf(FS_ERR_FORMAT, "%s: traceEvents[%lld]: '%s' is %g, not %s in [%g, %g]", origin,
                         (long long)i, key, x, integer ? "an integer" : "a number", lo, hi);
    *out = x;
    return FS_OK;
}

fs_status fs_trace_read_json(fs_trace_file *out, const char *text, size_t n, const char *origin) {
    memset(out, 0, sizeof *out);
    cJSON *root = cJSON_ParseWithLength(text, n);
    const cJSON *events = root ? cJSON_GetObjectItemCaseSensitive(root, "traceEvents") : NULL;
    if (!cJSON_IsArray(events)) {
        cJSON_Delete(root);
        return fs_errorf(FS_ERR_FORMAT, "%s: not a Chrome Trace Event file (no traceEvents array)", origin);
    }
    const int cap = cJSON_GetArraySize(events);
    fs_trace_box *boxes = calloc((size_t)cap + 1, sizeof *boxes);
    if (!boxes) {
        cJSON_Delete(root);
        return fs_errorf(FS_ERR_NOMEM, "%s: out of memory for %d events", origin, cap);
    }
    out->root = root;
    out->boxes = boxes;
    fs_status st = FS_OK;
    int64_t i = -1;
    for (const cJSON *e = events->child; st == FS_OK && e; e = e->next) {
        i++;
        const cJSON *ph = cJSON_GetObjectItemCaseSensitive(e, "ph");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(e, "args");
        const cJSON *step = cJSON_IsObject(args) ? cJSON_GetObjectItemCaseSensitive(args, "step") : NULL;
        const cJSON *kind = cJSON_IsObject(args) ? cJSON_GetObjectItemCaseSensitive(args, "kind") : NULL;
        if (!cJSON_IsString(ph) || strcmp(ph->valuestring, "X") != 0 || !step || !cJSON_IsString(kind))
            continue; /* not a flatshard event */
        fs_trace_box b = {.kind = kind->valuestring};
        const cJSON *name = cJSON_GetObjectItemCaseSensitive(e, "name");
        if (!cJSON_IsString(name)) {
            st = fs_errorf(FS_ERR_FORMAT, "%s: traceEvents[%lld]: 'name' is missing or not a string", origin,
                           (long long)i);
            break;
        }
        b.name = name->valuestring;
        double rank = 0, track = 0, s = 0, bytes = 0;
        st = number_field(e, "pid", 0, FS_TRACE_MAX_RANKS - 1, 1, origin, i, &rank);
        if (st == FS_OK) st = number_field(e, "tid", 0, 1, 1, origin, i, &track);
        if (st == FS_OK) st = number_field(e, "ts", -FS_TRACE_MAX_US, FS_TRACE_MAX_US, 0, origin, i, &b.ts_us);
        if (st == FS_OK) st = number_field(e, "dur", 0, FS_TRACE_MAX_US, 0, origin, i, &b.dur_us);
        if (st == FS_OK) st = number_field(args, "step", 1, (double)INT32_MAX, 1, origin, i, &s);
        if (st == FS_OK && cJSON_GetObjectItemCaseSensitive(args, "bytes"))
            st = number_field(args, "bytes", 0, 0x1p62, 0, origin, i, &bytes);
        if (st != FS_OK) break;
        b.rank = (int)rank;
        b.track = (int)track;
        b.step = (int64_t)s;
        b.bytes = bytes;
        boxes[out->n_boxes++] = b;
        if (b.rank + 1 > out->world) out->world = b.rank + 1;
        if (out->first_step == 0 || b.step < out->first_step) out->first_step = b.step;
        if (b.step > out->last_step) out->last_step = b.step;
    }
    if (st != FS_OK) fs_trace_file_free(out);
    return st;
}
