/*
 * Error reporting for the CPU engine.
 *
 * Every failing internal function calls h3r_seterr(code, fmt, ...) and returns
 * the negative code it was given. The formatted message lives in thread-local
 * storage, so two threads opening two models never see each other's messages.
 * API entry points (engine.c) copy it into the engine so that
 * h3r_last_error(e) survives later calls on other engines.
 */
#include <stdio.h>
#include <string.h>
#include "internal.h"

#define H3R_ERRMSG_MAX 1024 /* bytes, including the terminating NUL */

static _Thread_local char tls_msg[H3R_ERRMSG_MAX];

/*
 * Format a message into this thread's error buffer (truncated to
 * H3R_ERRMSG_MAX - 1 bytes) and return `code`, so callers can write
 *     return h3r_seterr(H3R_ERR_FORMAT, "%s: bad thing", path);
 */
int h3r_seterr(int code, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(tls_msg, sizeof(tls_msg), fmt, ap);
    va_end(ap);
    if (n < 0) snprintf(tls_msg, sizeof(tls_msg), "error %d (message could not be formatted)", code);
    return code;
}

/* This thread's last message; never NULL, empty when cleared. */
const char *h3r_tls_error(void) { return tls_msg; }

void h3r_clear_error(void) { tls_msg[0] = '\0'; }
