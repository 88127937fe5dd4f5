/*
 * aeron_subscribe: receives checked messages (message.h) on one Aeron subscription and checks
 * that each expected publisher's arrive whole and in order: sequence numbers 0, 1, 2, ... with
 * nothing lost, duplicated or reordered, every length and CRC right.
 *
 *   aeron_subscribe --dir DIR --channel aeron:ipc --stream N --expect PUBLISHER_ID:COUNT ...
 *                   [--await-images N] [--delay-us N] [--timeout-s S]
 *
 * Fragments are reassembled with aeron_fragment_assembler. Prints "READY" (flushed) to stdout
 * once the subscription is added and it has at least --await-images (0) images. --delay-us
 * sleeps after each message (a slow subscriber). The whole run is bounded by --timeout-s (30).
 *
 * Exit status 0 once every expected publisher's COUNT messages arrived intact; 1 at the first
 * message that breaks a rule (from a publisher not expected, past its COUNT, out of sequence,
 * corrupt) or when the time runs out, with stderr naming the publisher and the expected and got
 * sequence; 2 on a usage or setup error. Prints one JSON line to stdout at the end:
 * {"program", "stream", "expected": {id: count}, "received": {id: count}, "messages", "bytes",
 *  "errors", "error", "seconds", "ok"}.
 */
#define _POSIX_C_SOURCE 200809L

#include "common.h"
#include "message.h"

static const char *const PROGRAM = "aeron_subscribe";

#define MAX_PUBLISHERS 64

typedef struct
{
    uint32_t id;
    long long expected;
    long long received;
}
publisher_t;

typedef struct
{
    const char *dir;
    const char *channel;
    int32_t stream;
    int await_images;
    long delay_us;
    double timeout_s;
    publisher_t publishers[MAX_PUBLISHERS];
    int publisher_count;
    long long messages;
    long long bytes;
    char error[512]; /* the first failure; empty while there is none */
}
state_t;

static void parse_expect(state_t *s, const char *text)
{
    const char *colon = strchr(text, ':');
    if (colon == NULL || colon == text || s->publisher_count == MAX_PUBLISHERS)
    {
        die(PROGRAM, "--expect: expected PUBLISHER_ID:COUNT (at most %d), got '%s'", MAX_PUBLISHERS, text);
    }
    char id_text[32];
    const size_t id_length = (size_t)(colon - text);
    if (id_length >= sizeof(id_text))
    {
        die(PROGRAM, "--expect: publisher id too long in '%s'", text);
    }
    memcpy(id_text, text, id_length);
    id_text[id_length] = '\0';
    publisher_t *p = &s->publishers[s->publisher_count];
    p->id = (uint32_t)parse_integer(PROGRAM, "--expect publisher id", id_text, 0, UINT32_MAX);
    p->expected = parse_integer(PROGRAM, "--expect count", colon + 1, 0, INT64_MAX);
    p->received = 0;
    for (int i = 0; i < s->publisher_count; i++)
    {
        if (s->publishers[i].id == p->id)
        {
            die(PROGRAM, "--expect: publisher %u given twice", p->id);
        }
    }
    s->publisher_count++;
}

static void parse_options(state_t *s, int argc, char **argv)
{
    for (int i = 1; i < argc; i++)
    {
        const char *name = argv[i];
        if (strcmp(name, "--dir") == 0)
        {
            s->dir = option_value(PROGRAM, argc, argv, &i);
        }
        else if (strcmp(name, "--channel") == 0)
        {
            s->channel = option_value(PROGRAM, argc, argv, &i);
        }
        else if (strcmp(name, "--stream") == 0)
        {
            s->stream = (int32_t)parse_integer(
                PROGRAM, name, option_value(PROGRAM, argc, argv, &i), INT32_MIN, INT32_MAX);
        }
        else if (strcmp(name, "--expect") == 0)
        {
            parse_expect(s, option_value(PROGRAM, argc, argv, &i));
        }
        else if (strcmp(name, "--await-images") == 0)
        {
            s->await_images = (int)parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, 1024);
        }
        else if (strcmp(name, "--delay-us") == 0)
        {
            s->delay_us = (long)parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, 1000000);
        }
        else if (strcmp(name, "--timeout-s") == 0)
        {
            s->timeout_s = (double)parse_integer(
                PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 1, 24 * 3600);
        }
        else
        {
            die(PROGRAM, "unknown option %s", name);
        }
    }
    if (s->dir == NULL || s->stream == -1 || s->publisher_count == 0)
    {
        die(PROGRAM, "usage: %s --dir DIR --channel aeron:ipc --stream N --expect PUBLISHER_ID:COUNT ... "
            "[--await-images N] [--delay-us N] [--timeout-s S]", PROGRAM);
    }
}

static void fail(state_t *s, const char *format, ...)
{
    if (s->error[0] != '\0')
    {
        return;
    }
    va_list args;
    va_start(args, format);
    vsnprintf(s->error, sizeof(s->error), format, args);
    va_end(args);
}

static int all_arrived(const state_t *s)
{
    for (int i = 0; i < s->publisher_count; i++)
    {
        if (s->publishers[i].received < s->publishers[i].expected)
        {
            return 0;
        }
    }
    return 1;
}

/* The handler of whole (reassembled) messages. */
static void on_message(void *clientd, const uint8_t *buffer, size_t length, aeron_header_t *header)
{
    (void)header;
    state_t *s = (state_t *)clientd;
    if (s->error[0] != '\0')
    {
        return;
    }
    uint32_t id = 0;
    uint64_t sequence = 0;
    const char *problem = message_check(buffer, length, &id, &sequence);
    if (problem != NULL)
    {
        fail(s, "publisher %u: message of %zu bytes with sequence %" PRIu64 " (after %lld messages in all): %s",
            id, length, sequence, s->messages, problem);
        return;
    }
    publisher_t *p = NULL;
    for (int i = 0; i < s->publisher_count && p == NULL; i++)
    {
        p = s->publishers[i].id == id ? &s->publishers[i] : NULL;
    }
    if (p == NULL)
    {
        fail(s, "publisher %u: not expected, got its sequence %" PRIu64, id, sequence);
        return;
    }
    if (sequence != (uint64_t)p->received)
    {
        fail(s, "publisher %u: expected sequence %lld, got sequence %" PRIu64 " (%s)", id, p->received, sequence,
            sequence > (uint64_t)p->received ? "lost" : "duplicated or reordered");
        return;
    }
    if (p->received >= p->expected)
    {
        fail(s, "publisher %u: expected %lld messages, got sequence %" PRIu64 " beyond them", id, p->expected,
            sequence);
        return;
    }
    p->received++;
    s->messages++;
    s->bytes += (long long)length;
    if (s->delay_us > 0)
    {
        sleep_ns(s->delay_us * 1000L);
    }
}

static aeron_subscription_t *add_subscription(aeron_t *client, const state_t *s, double deadline)
{
    aeron_async_add_subscription_t *async = NULL;
    aeron_subscription_t *subscription = NULL;
    if (aeron_async_add_subscription(&async, client, s->channel, s->stream, NULL, NULL, NULL, NULL) < 0)
    {
        die(PROGRAM, "add subscription: %s", aeron_errmsg());
    }
    unsigned streak = 0;
    int rc;
    while ((rc = aeron_async_add_subscription_poll(&subscription, async)) == 0 && now_s() < deadline)
    {
        back_off(&streak);
    }
    if (rc < 0)
    {
        die(PROGRAM, "add subscription %s stream %d: %s", s->channel, s->stream, aeron_errmsg());
    }
    if (rc == 0)
    {
        die(PROGRAM, "no subscription %s stream %d within %.0f s", s->channel, s->stream, s->timeout_s);
    }
    return subscription;
}

static void print_summary(const state_t *s, double seconds)
{
    printf("{\"program\": \"%s\", \"stream\": %d, \"expected\": {", PROGRAM, s->stream);
    for (int i = 0; i < s->publisher_count; i++)
    {
        printf("%s\"%u\": %lld", i ? ", " : "", s->publishers[i].id, s->publishers[i].expected);
    }
    printf("}, \"received\": {");
    for (int i = 0; i < s->publisher_count; i++)
    {
        printf("%s\"%u\": %lld", i ? ", " : "", s->publishers[i].id, s->publishers[i].received);
    }
    printf("}, \"messages\": %lld, \"bytes\": %lld, \"errors\": %d, \"error\": ",
        s->messages, s->bytes, s->error[0] != '\0');
    if (s->error[0] != '\0')
    {
        print_json_string(stdout, s->error, strlen(s->error));
    }
    else
    {
        printf("null");
    }
    printf(", \"seconds\": %.3f, \"ok\": %s}\n", seconds, s->error[0] == '\0' ? "true" : "false");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    static state_t s;
    s.channel = "aeron:ipc";
    s.stream = -1;
    s.timeout_s = 30.0;
    parse_options(&s, argc, argv);
    const double start = now_s();
    const double deadline = start + s.timeout_s;

    aeron_context_t *context = NULL;
    aeron_t *client = connect_client(PROGRAM, s.dir, &context);
    aeron_subscription_t *subscription = add_subscription(client, &s, deadline);
    unsigned streak = 0;
    while (aeron_subscription_image_count(subscription) < s.await_images)
    {
        if (now_s() > deadline)
        {
            die(PROGRAM, "%d of %d images within %.0f s", aeron_subscription_image_count(subscription),
                s.await_images, s.timeout_s);
        }
        back_off(&streak);
    }
    printf("READY\n");
    fflush(stdout);

    aeron_fragment_assembler_t *assembler = NULL;
    if (aeron_fragment_assembler_create(&assembler, on_message, &s) < 0)
    {
        die(PROGRAM, "fragment assembler: %s", aeron_errmsg());
    }
    streak = 0;
    while (s.error[0] == '\0' && !all_arrived(&s))
    {
        if (now_s() > deadline)
        {
            for (int i = 0; i < s.publisher_count; i++)
            {
                const publisher_t *p = &s.publishers[i];
                if (p->received < p->expected)
                {
                    fail(&s, "publisher %u: timed out after %.0f s expecting sequence %lld (got %lld of %lld "
                        "messages)", p->id, s.timeout_s, p->received, p->received, p->expected);
                    break;
                }
            }
            break;
        }
        const int fragments = aeron_subscription_poll(subscription, aeron_fragment_assembler_handler, assembler, 64);
        if (fragments < 0)
        {
            fail(&s, "poll: %s", aeron_errmsg());
        }
        else if (fragments > 0)
        {
            streak = 0;
        }
        else
        {
            back_off(&streak);
        }
    }
    if (s.error[0] != '\0')
    {
        fprintf(stderr, "%s: %s\n", PROGRAM, s.error);
    }
    print_summary(&s, now_s() - start);

    aeron_fragment_assembler_delete(assembler);
    aeron_subscription_close(subscription, NULL, NULL);
    aeron_close(client);
    aeron_context_close(context);
    return s.error[0] == '\0' ? 0 : 1;
}
