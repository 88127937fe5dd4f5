/*
 * What the programs share beside the message format: the clock and deadlines, the bounded
 * back-off between retries, option parsing, connecting an Aeron client to a directory, JSON
 * strings, and for the long-running modes (--until-stopped) the stop signals, Aeron's client
 * errors caught instead of exiting, and a progress file other processes read while the program
 * runs (and after a SIGKILL). Each program includes it once (static functions, no separate
 * object).
 */
#ifndef SHMBUS_TEST_AERON_C_COMMON_H
#define SHMBUS_TEST_AERON_C_COMMON_H

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "aeronc.h"

/* Seconds on the monotonic clock. */
static inline double now_s(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec / 1e9;
}

static inline void sleep_ns(long ns)
{
    struct timespec ts = { ns / 1000000000L, ns % 1000000000L };
    while (nanosleep(&ts, &ts) != 0 && errno == EINTR)
    {
    }
}

/* One wait of a back-off: the n-th consecutive wait (n = *streak) sleeps 1 us * 2^n, at most
 * 1 ms; reset *streak to 0 after progress. Never spins: the tests share two cores with the
 * driver and the peer program. */
static inline void back_off(unsigned *streak)
{
    const unsigned n = *streak < 10 ? *streak : 10;
    sleep_ns(1000L << n);
    (*streak)++;
}

/* The exit status of die(): 2 (a usage or setup failure); a long-running mode sets
 * EXIT_CLIENT_ENDED once its options are read, so a connect or an add that the driver refuses
 * or does not answer (the driver gone or being replaced) ends the run as the client's end does. */
#define EXIT_CLIENT_ENDED 3
static int setup_failure_status = 2;

/* Prints "program: message" to stderr and exits with setup_failure_status (a failed check
 * exits 1). */
static inline void die(const char *program, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    fprintf(stderr, "%s: ", program);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(setup_failure_status);
}

/* The value of option `name` at argv[*i + 1] (and *i moves past it); dies when it is missing. */
static inline const char *option_value(const char *program, int argc, char **argv, int *i)
{
    if (*i + 1 >= argc)
    {
        die(program, "%s needs a value", argv[*i]);
    }
    *i += 1;
    return argv[*i];
}

/* `text` as an integer in [min, max]; dies naming `name` when it is not one. */
static inline long long parse_integer(
    const char *program, const char *name, const char *text, long long min, long long max)
{
    char *end = NULL;
    errno = 0;
    const long long value = strtoll(text, &end, 10);
    if (errno != 0 || end == text || *end != '\0' || value < min || value > max)
    {
        die(program, "%s: expected an integer in [%lld, %lld], got '%s'", name, min, max, text);
    }
    return value;
}

/* An Aeron client of the driver whose directory is `dir`: the default context, its directory
 * set and the program's name as the client name (the driver's heartbeat label shows it),
 * started. With `catch_errors`, Aeron's client errors go to catch_client_error (below) instead
 * of Aeron's default handler, which exits; `driver_timeout_ms` > 0 sets how long the client
 * waits for the driver's heartbeat before it ends (Aeron's default 10 s otherwise). Dies with
 * Aeron's error message when it cannot connect. */
static inline aeron_t *connect_client_to(
    const char *program, const char *dir, aeron_context_t **context, int catch_errors, long long driver_timeout_ms);

static inline aeron_t *connect_client(const char *program, const char *dir, aeron_context_t **context)
{
    return connect_client_to(program, dir, context, 0, 0);
}

/* The first error Aeron's client conductor reported (catch_client_error), read by the main
 * thread: state 0 none, 1 being written, 2 written (code and message then final). */
typedef struct
{
    int state;
    int code;
    char message[400];
}
client_error_t;

static client_error_t client_error;

/* Aeron's error handler in the long-running modes: keeps the first error for the main thread
 * (called on the client conductor's thread). */
static void catch_client_error(void *clientd, int errcode, const char *message)
{
    (void)clientd;
    int expected = 0;
    if (!__atomic_compare_exchange_n(&client_error.state, &expected, 1, 0, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE))
    {
        return;
    }
    client_error.code = errcode;
    snprintf(client_error.message, sizeof(client_error.message), "%s", message != NULL ? message : "");
    __atomic_store_n(&client_error.state, 2, __ATOMIC_RELEASE);
}

/* Whether Aeron's client reported an error (then client_error.code and .message hold it). */
static inline int client_error_seen(void)
{
    return __atomic_load_n(&client_error.state, __ATOMIC_ACQUIRE) == 2;
}

/* Whether the error reported is the client's end that a driver's death or a pause brings:
 * the driver's heartbeat lost or the driver shut down (AERON_CLIENT_ERROR_DRIVER_TIMEOUT), the
 * driver timing the client out (CLIENT_TIMEOUT), its own conductor not serviced in time
 * (CONDUCTOR_SERVICE_TIMEOUT). Any other error (a malformed or unknown response) is not. */
static inline int client_error_is_end(void)
{
    return client_error.code == AERON_CLIENT_ERROR_DRIVER_TIMEOUT ||
        client_error.code == AERON_CLIENT_ERROR_CLIENT_TIMEOUT ||
        client_error.code == AERON_CLIENT_ERROR_CONDUCTOR_SERVICE_TIMEOUT;
}

/* Waits up to `timeout_s` for Aeron's client to report an error (a resource closed under the
 * program is closed by the conductor just before it reports the client's end); whether it did. */
static inline int client_error_within(double timeout_s)
{
    const double deadline = now_s() + timeout_s;
    while (!client_error_seen() && now_s() < deadline)
    {
        sleep_ns(1000000L);
    }
    return client_error_seen();
}

static inline aeron_t *connect_client_to(
    const char *program, const char *dir, aeron_context_t **context, int catch_errors, long long driver_timeout_ms)
{
    aeron_t *client = NULL;
    if (aeron_context_init(context) < 0 || aeron_context_set_dir(*context, dir) < 0 ||
        aeron_context_set_client_name(*context, program) < 0)
    {
        die(program, "context: %s", aeron_errmsg());
    }
    if (catch_errors && aeron_context_set_error_handler(*context, catch_client_error, NULL) < 0)
    {
        die(program, "error handler: %s", aeron_errmsg());
    }
    if (driver_timeout_ms > 0 && aeron_context_set_driver_timeout_ms(*context, (uint64_t)driver_timeout_ms) < 0)
    {
        die(program, "driver timeout: %s", aeron_errmsg());
    }
    if (aeron_init(&client, *context) < 0)
    {
        die(program, "aeron_init (dir %s): %s", dir, aeron_errmsg());
    }
    if (aeron_start(client) < 0)
    {
        die(program, "aeron_start (dir %s): %s", dir, aeron_errmsg());
    }
    return client;
}

/* `length` bytes of `text` as a JSON string: quote, backslash and bytes outside printable ASCII
 * escaped (\u00XX), so any label makes valid JSON. */
static inline void print_json_string(FILE *out, const char *text, size_t length)
{
    fputc('"', out);
    for (size_t i = 0; i < length; i++)
    {
        const unsigned char c = (unsigned char)text[i];
        if (c == '"' || c == '\\')
        {
            fprintf(out, "\\%c", c);
        }
        else if (c < 0x20 || c > 0x7E)
        {
            fprintf(out, "\\u%04x", c);
        }
        else
        {
            fputc(c, out);
        }
    }
    fputc('"', out);
}

/* Stop signals (SIGTERM, SIGINT) received since watch_stop_signals(). */
static volatile sig_atomic_t stop_signals = 0;

static void on_stop_signal(int signal_number)
{
    (void)signal_number;
    stop_signals = stop_signals + 1;
}

/* Counts SIGTERM and SIGINT in stop_signals instead of ending the process (a long-running mode
 * stops at the first and reports); a sleep they interrupt goes on (sleep_ns). */
static inline void watch_stop_signals(const char *program)
{
    struct sigaction action;
    memset(&action, 0, sizeof(action));
    action.sa_handler = on_stop_signal;
    sigemptyset(&action.sa_mask);
    sigaddset(&action.sa_mask, SIGTERM);
    sigaddset(&action.sa_mask, SIGINT);
    if (sigaction(SIGTERM, &action, NULL) < 0 || sigaction(SIGINT, &action, NULL) < 0)
    {
        die(program, "sigaction: %s", strerror(errno));
    }
}

/* A progress file: 8-byte aligned little-endian i64 fields at offsets the caller names, which the
 * program stores with release semantics as it goes, so another process mapping the same file
 * reads them while it runs and after it is killed. */
typedef struct
{
    uint8_t *base;
    size_t length;
}
progress_t;

/* Maps `path` (which must exist, at least as long as every offset given + 8); an unmapped
 * progress (base NULL) when `path` is NULL. Dies when it cannot. */
static inline progress_t progress_open(const char *program, const char *path)
{
    progress_t progress = { NULL, 0 };
    if (path == NULL)
    {
        return progress;
    }
    const int fd = open(path, O_RDWR);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) < 0)
    {
        die(program, "--progress %s: %s", path, strerror(errno));
    }
    void *base = mmap(NULL, (size_t)st.st_size, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (base == MAP_FAILED)
    {
        die(program, "--progress %s: mmap: %s", path, strerror(errno));
    }
    close(fd);
    progress.base = (uint8_t *)base;
    progress.length = (size_t)st.st_size;
    return progress;
}

/* Dies unless `offset` names an 8-byte aligned field inside the file (or there is no file). */
static inline void progress_check_offset(const char *program, const progress_t *progress, const char *name, long long offset)
{
    if (progress->base != NULL && (offset < 0 || offset % 8 != 0 || (size_t)offset + 8 > progress->length))
    {
        die(program, "%s %lld: not an 8-byte aligned field of the %zu-byte progress file", name, offset, progress->length);
    }
}

static inline int64_t progress_load(const progress_t *progress, long long offset)
{
    if (progress->base == NULL || offset < 0)
    {
        return 0;
    }
    return __atomic_load_n((int64_t *)(void *)(progress->base + offset), __ATOMIC_ACQUIRE);
}

static inline void progress_store(const progress_t *progress, long long offset, int64_t value)
{
    if (progress->base != NULL && offset >= 0)
    {
        __atomic_store_n((int64_t *)(void *)(progress->base + offset), value, __ATOMIC_RELEASE);
    }
}

#endif
