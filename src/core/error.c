/*
 * error.c — status names, the per-thread error message, and always-on assertions.
 *
 * The message lives in thread-local storage because in-process ranks are threads: each rank
 * reports its own failure without a lock and without overwriting another rank's message.
 */
#include "flatshard/core.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define FS_ERROR_MESSAGE_BYTES 1024

static _Thread_local char error_message[FS_ERROR_MESSAGE_BYTES];
static _Thread_local int thread_rank = -1;

fs_status fs_errorf(fs_status st, const char *fmt, ...) {
    /* formatted aside first: an argument may be fs_error_message() itself (adding context to
     * a deeper error), which vsnprintf into the same buffer would read while writing it */
    char message[FS_ERROR_MESSAGE_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    memcpy(error_message, message, sizeof message);
    return st;
}

fs_status fs_error_wrap(fs_status st, const char *fmt, ...) {
    char prefix[FS_ERROR_MESSAGE_BYTES];
    char inner[FS_ERROR_MESSAGE_BYTES];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(prefix, sizeof prefix, fmt, ap);
    va_end(ap);
    memcpy(inner, error_message, sizeof inner);
    /* Truncation of an over-long message is acceptable; say so to the compiler. */
    int n = snprintf(error_message, sizeof error_message, "%s: ", prefix);
    if (n >= 0 && (size_t)n < sizeof error_message)
        snprintf(error_message + n, sizeof error_message - (size_t)n, "%s", inner);
    return st;
}

const char *fs_error_message(void) { return error_message; }

fs_printable_text fs_printable(const char *s) {
    fs_printable_text t;
    size_t n = strlen(s), k = 0, i = 0;
    for (; i < n && i < FS_PRINTABLE_MAX; i++) {
        const unsigned char c = (unsigned char)s[i];
        if (c == '\\') {
            t.s[k++] = '\\';
            t.s[k++] = '\\';
        } else if (c < 0x20 || c > 0x7e) {
            k += (size_t)snprintf(t.s + k, sizeof t.s - k, "\\x%02x", c);
        } else {
            t.s[k++] = (char)c;
        }
    }
    t.s[k] = '\0';
    if (i < n) snprintf(t.s + k, sizeof t.s - k, "...(%zu bytes)", n);
    return t;
}

const char *fs_status_name(fs_status st) {
    switch (st) {
    case FS_OK: return "ok";
    case FS_ERR_USAGE: return "usage error";
    case FS_ERR_IO: return "i/o error";
    case FS_ERR_FORMAT: return "format error";
    case FS_ERR_NOMEM: return "out of memory";
    case FS_ERR_INTERNAL: return "internal error";
    }
    return "unknown status";
}

void fs_set_thread_rank(int rank) { thread_rank = rank; }

_Noreturn void fs_assert_fail(const char *cond, const char *file, int line) {
    if (thread_rank >= 0)
        fprintf(stderr, "flatshard: rank %d: assertion failed: %s at %s:%d\n", thread_rank, cond,
                file, line);
    else
        fprintf(stderr, "flatshard: assertion failed: %s at %s:%d\n", cond, file, line);
    fflush(stderr);
    abort();
}
