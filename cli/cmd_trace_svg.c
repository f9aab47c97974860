/*
 * cli/cmd_trace_svg.c — `flatshard trace-svg`: one step of a timeline as a static picture.
 *
 * Two rows per rank, compute above communication, like the timeline figures YaFSDP
 * publishes: where a gather sits beside the op that computes while it runs, overlap is there
 * to see; where the compute row has a gap ("wait"), the communication was exposed.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "args.h"
#include "commands.h"
#include "common.h"
#include "flatshard/core.h"
#include "flatshard/trace.h"

static const fs_command_help svg_help = {
    .usage = "flatshard trace-svg FILE.json -o OUT.svg [options]",
    .description =
        "Draws one step of a timeline written by 'flatshard train --trace FILE.json' as an SVG:\n"
        "for every rank a compute row (forward, backward, waits, optimizer) and a communication\n"
        "row (all-gathers, reduce-scatters, all-reduces, copies), on one time axis. Every box has\n"
        "a tooltip with its name, duration and bytes.",
    .epilog = "example:\n  flatshard trace-svg out/trace.json -o out/step.svg --step 3",
};

typedef struct box {
    int rank, track;
    double ts, dur; /* microseconds */
    const char *kind, *name;
    double bytes;
} box;

static const char *color_of(const char *kind) {
    static const struct {
        const char *kind, *color;
    } colors[] = {
        {"forward", "#4e79a7"},     {"backward", "#59a14f"},   {"wait", "#f1b6b6"},
        {"optimizer", "#b07aa1"},   {"all_gather", "#f28e2b"}, {"reduce_scatter", "#e15759"},
        {"all_reduce", "#9c755f"},  {"broadcast", "#76b7b2"},  {"barrier", "#bab0ac"},
        {"copy", "#bab0ac"},
    };
    for (size_t i = 0; i < sizeof colors / sizeof colors[0]; i++)
        if (strcmp(colors[i].kind, kind) == 0) return colors[i].color;
    return "#999999";
}

/* A short label for a box wide enough to hold one: "F 3", "AG 3", ... */
static void short_label(const box *b, char *buf, size_t n) {
    const char *k = b->kind;
    const char *abbr = !strcmp(k, "forward") ? "F" : !strcmp(k, "backward") ? "B" : !strcmp(k, "all_gather") ? "AG"
                       : !strcmp(k, "reduce_scatter") ? "RS" : !strcmp(k, "all_reduce") ? "AR"
                       : !strcmp(k, "optimizer") ? "opt" : !strcmp(k, "wait") ? "wait" : k;
    const char *digits = b->name + strcspn(b->name, "0123456789");
    if (strstr(b->name, "block")) snprintf(buf, n, "%s %s", abbr, digits);
    else if (strstr(b->name, "embedding")) snprintf(buf, n, "%s emb", abbr);
    else if (strstr(b->name, "lm_head")) snprintf(buf, n, "%s head", abbr);
    else if (strstr(b->name, "norm")) snprintf(buf, n, "%s norms", abbr);
    else snprintf(buf, n, "%s", abbr);
}

/* Text for an SVG element: the XML specials as entities, and a control byte or any byte
 * outside ASCII as the characters \xNN, as fs_printable writes them. flatshard's names are
 * ASCII; a timeline edited by hand or by another tool can hold a raw control character or
 * invalid UTF-8, which makes a file no XML reader takes. */
static void xml_escape(FILE *f, const char *s) {
    for (; *s; s++) {
        const unsigned char c = (unsigned char)*s;
        if (c == '<') fputs("&lt;", f);
        else if (c == '>') fputs("&gt;", f);
        else if (c == '&') fputs("&amp;", f);
        else if (c == '"') fputs("&quot;", f);
        else if (c < 0x20 || c > 0x7e) fprintf(f, "\\x%02x", c);
        else fputc(c, f);
    }
}

static double nice_tick(double span_us) {
    double raw = span_us / 8.0, p = pow(10.0, floor(log10(raw)));
    double m = raw / p;
    return (m < 1.5 ? 1 : m < 3.5 ? 2 : m < 7.5 ? 5 : 10) * p;
}

/* "steps 2-3" or "step 2": the range of steps the timeline's events carry, for messages. */
static void steps_present(const fs_trace_file *tf, char *buf, size_t n) {
    long lo = (long)tf->first_step, hi = (long)tf->last_step;
    if (lo == 0) snprintf(buf, n, "no steps");
    else if (lo == hi) snprintf(buf, n, "step %ld", lo);
    else snprintf(buf, n, "steps %ld-%ld", lo, hi);
}

static fs_status render(const fs_trace_file *tf, const char *path, long step, const char *out, double width, int *n_boxes) {
    /* the boxes of the step (fs_trace_read_json checked every field) */
    int n = 0, world = 0;
    box *boxes = calloc((size_t)tf->n_boxes + 1, sizeof *boxes);
    if (!boxes) return fs_errorf(FS_ERR_NOMEM, "trace-svg: out of memory");
    double t0 = INFINITY, t1 = -INFINITY;
    for (int64_t i = 0; i < tf->n_boxes; i++) {
        const fs_trace_box *tb = &tf->boxes[i];
        if (tb->step != step || !strcmp(tb->kind, "step")) continue;
        box *b = &boxes[n++];
        *b = (box){.rank = tb->rank, .track = tb->track, .ts = tb->ts_us, .dur = tb->dur_us,
                   .kind = tb->kind, .name = tb->name, .bytes = tb->bytes};
        if (b->rank + 1 > world) world = b->rank + 1;
        if (b->ts < t0) t0 = b->ts;
        if (b->ts + b->dur > t1) t1 = b->ts + b->dur;
    }
    *n_boxes = n;
    if (n == 0) {
        free(boxes);
        char have[64];
        steps_present(tf, have, sizeof have);
        return fs_errorf(FS_ERR_USAGE, "--step %ld: the timeline %s holds %s (train --trace-steps sets how many)", step,
                         path, have);
    }
    fs_cli_output o; /* written under a temporary name, renamed when complete */
    fs_status st = fs_cli_output_open("-o", out, &o);
    if (st != FS_OK) {
        free(boxes);
        return st;
    }
    FILE *f = o.f;
    /* a step whose boxes all have zero length at one instant still gets a 1 us axis */
    const double left = 130, right = 20, top = 50, row = 24, gap = 14, span = t1 > t0 ? t1 - t0 : 1.0;
    const double plot = width - left - right, height = top + world * (2 * row + gap) + 90;
    fprintf(f, "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" height=\"%.0f\" font-family=\"sans-serif\" "
               "font-size=\"11\">\n<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n", width, height);
    fprintf(f, "<text x=\"%.0f\" y=\"22\" font-size=\"15\">step %ld: %d rank%s, compute and communication (%.1f ms)</text>\n",
            left, step, world, world == 1 ? "" : "s", span / 1000.0);
    /* time axis */
    double tick = nice_tick(span), axis_y = top + world * (2 * row + gap);
    for (double t = 0; t <= span + 1e-9; t += tick) {
        double x = left + plot * t / span;
        fprintf(f, "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" stroke=\"#e0e0e0\"/>\n", x, top - 4, x, axis_y);
        fprintf(f, "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%g ms</text>\n", x, axis_y + 14, t / 1000.0);
    }
    for (int r = 0; r < world; r++) {
        double y = top + r * (2 * row + gap);
        fprintf(f, "<text x=\"8\" y=\"%.0f\">rank %d compute</text>\n", y + 16, r);
        fprintf(f, "<text x=\"8\" y=\"%.0f\">rank %d comm</text>\n", y + row + 16, r);
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"%.0f\" height=\"%.0f\" fill=\"#f7f7f7\"/>\n", left, y, plot, 2 * row);
    }
    for (int i = 0; i < n; i++) {
        const box *b = &boxes[i];
        double x = left + plot * (b->ts - t0) / span, w = fmax(0.5, plot * b->dur / span);
        double y = top + b->rank * (2 * row + gap) + (b->track ? row : 0) + 2;
        fprintf(f, "<rect x=\"%.2f\" y=\"%.1f\" width=\"%.2f\" height=\"%.0f\" fill=\"%s\" stroke=\"white\" stroke-width=\"0.5\"><title>",
                x, y, w, row - 4, color_of(b->kind));
        xml_escape(f, b->name);
        fprintf(f, ": %.3f ms", b->dur / 1000.0);
        if (b->bytes > 0) fprintf(f, ", %.2f MiB", b->bytes / 1048576.0);
        fprintf(f, "</title></rect>\n");
        char label[32];
        short_label(b, label, sizeof label);
        if (w > 7.0 * (double)strlen(label)) { /* a kind flatshard does not name is the file's text */
            fprintf(f, "<text x=\"%.1f\" y=\"%.1f\" fill=\"white\" font-size=\"10\">", x + 2, y + 13);
            xml_escape(f, label);
            fputs("</text>\n", f);
        }
    }
    /* legend */
    static const char *const legend[] = {"forward", "backward", "wait", "optimizer", "all_gather",
                                         "reduce_scatter", "all_reduce", "copy"};
    for (size_t i = 0; i < sizeof legend / sizeof legend[0]; i++) {
        double x = left + (double)i * 110, y = axis_y + 34;
        fprintf(f, "<rect x=\"%.0f\" y=\"%.0f\" width=\"12\" height=\"12\" fill=\"%s\"/>", x, y, color_of(legend[i]));
        fprintf(f, "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n", x + 16, y + 10, legend[i]);
    }
    fprintf(f, "</svg>\n");
    free(boxes);
    return fs_cli_output_commit("-o", out, &o);
}

/* Reads a whole timeline into *text (NUL-terminated, malloc'ed), to EOF rather than to a size
 * asked first, so that a pipe (<(zcat trace.json.gz)) reads too: ftell gives none, which was
 * once reported as "out of memory". At most 1 GiB. A file or a pipe only: a directory was
 * once "out of memory", and /dev/zero would be read to the 1 GiB limit. */
static fs_status read_all(const char *path, char **text, size_t *n) {
    *text = NULL;
    *n = 0;
    FILE *f = NULL;
    FS_TRY(fs_file_fopen(path, "a timeline file", FS_FILE_PIPE_OK, FS_ERR_USAGE, &f));
    size_t cap = 0, len = 0;
    char *buf = NULL;
    fs_status st = FS_OK;
    for (;;) {
        if (len + 65536 + 1 > cap) {
            if (cap >= ((size_t)1 << 30)) {
                st = fs_errorf(FS_ERR_FORMAT, "%s: larger than 1 GiB; not a timeline flatshard wrote", path);
                break;
            }
            size_t want = cap ? 2 * cap : (size_t)1 << 20;
            char *grown = realloc(buf, want);
            if (!grown) {
                st = fs_errorf(FS_ERR_NOMEM, "%s: out of memory for %zu bytes", path, want);
                break;
            }
            buf = grown;
            cap = want;
        }
        size_t r = fread(buf + len, 1, cap - len - 1, f);
        len += r;
        if (r == 0) {
            if (ferror(f)) st = fs_errorf(FS_ERR_IO, "%s: cannot read: %s", path, strerror(errno));
            break;
        }
    }
    fclose(f);
    if (st != FS_OK) {
        free(buf);
        return st;
    }
    buf[len] = '\0';
    *text = buf;
    *n = len;
    return FS_OK;
}

int fs_cmd_trace_svg(int argc, char **argv) {
    const char *out = NULL;
    int64_t step = 0, width = 1400;
    const fs_opt opts[] = {
        {"out", 'o', FS_OPT_STRING, &out, "OUT.svg", "the picture to write", NULL, 0, 0},
        {"step", 0, FS_OPT_INT, &step, "N", "the step to draw (0: the first in the timeline)", NULL, 0, INT64_MAX},
        {"width", 0, FS_OPT_INT, &width, "PX", "picture width in pixels", NULL, 400, 20000},
        {NULL, 0, 0, NULL, NULL, NULL, NULL, 0, 0},
    };
    const char *in[1] = {NULL};
    int npos = 0;
    int rc = fs_args_parse("trace-svg", &svg_help, opts, argc, argv, in, 1, &npos);
    if (rc < 0) return FS_EXIT_OK;
    if (rc != FS_EXIT_OK) return rc;
    if (npos != 1) return fs_usage_error("trace-svg", "FILE.json is required; see 'flatshard trace-svg --help'");
    if (!out) return fs_usage_error("trace-svg", "-o OUT.svg is required");
    if (!in[0][0]) return fs_usage_error("trace-svg", "FILE.json is empty");
    /* before reading: -o is not the timeline (it was once written over it), its directory
     * exists (created) */
    fs_status st = fs_cli_check_output("-o", out, in, 1, 1);
    if (st != FS_OK) return fs_cli_report("trace-svg", st);
    char *text = NULL;
    size_t got = 0;
    st = read_all(in[0], &text, &got);
    fs_trace_file tf = {0};
    if (st == FS_OK) st = fs_trace_read_json(&tf, text, got, in[0]);
    free(text);
    if (st == FS_OK && step == 0) { /* the first step present */
        step = tf.first_step;
        if (step == 0) st = fs_errorf(FS_ERR_FORMAT, "%s: no flatshard step events", in[0]);
    }
    int n = 0;
    if (st == FS_OK) st = render(&tf, in[0], (long)step, out, (double)width, &n);
    fs_trace_file_free(&tf);
    if (st != FS_OK) return fs_cli_report("trace-svg", st);
    /* the picture written to standard output (-o /dev/stdout > x.svg, | less) or to some
     * other stream must stay a picture: the line goes to stderr then */
    struct stat so, sp;
    const int to_stream = stat(out, &sp) != 0 || !S_ISREG(sp.st_mode) ||
                          (fstat(STDOUT_FILENO, &so) == 0 && fs_stat_same(&sp, &so));
    fprintf(to_stream ? stderr : stdout, "drew step %lld (%d boxes) to %s\n", (long long)step, n, out);
    return FS_EXIT_OK;
}
