/*
 * What the test programs share beside the message format: the clock and deadlines, the bounded
 * back-off between retries, option parsing, connecting an Aeron client to a directory, and JSON
 * strings. Each program includes it once (static functions, no separate object).
 */
#ifndef SHMBUS_TEST_AERON_C_COMMON_H
#define SHMBUS_TEST_AERON_C_COMMON_H

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

/* Prints "program: message" to stderr and exits with status 2 (a usage or setup failure; a
 * failed check exits 1). */
static inline void die(const char *program, const char *format, ...)
{
    va_list args;
    va_start(args, format);
    fprintf(stderr, "%s: ", program);
    vfprintf(stderr, format, args);
    fputc('\n', stderr);
    va_end(args);
    exit(2);
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
 * started. Dies with Aeron's error message when it cannot connect. */
static inline aeron_t *connect_client(const char *program, const char *dir, aeron_context_t **context)
{
    aeron_t *client = NULL;
    if (aeron_context_init(context) < 0 || aeron_context_set_dir(*context, dir) < 0 ||
        aeron_context_set_client_name(*context, program) < 0)
    {
        die(program, "context: %s", aeron_errmsg());
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

#endif
