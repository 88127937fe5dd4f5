/*
 * aeron_publish: offers `--count` checked messages (message.h) of `--length` bytes, sequence
 * numbers 0, 1, 2, ..., on one Aeron publication (concurrent, or exclusive with --exclusive).
 *
 *   aeron_publish --dir DIR --channel aeron:ipc --stream N --count N --length BYTES
 *                 --publisher-id N [--exclusive] [--corrupt-sequence N] [--timeout-s S]
 *
 * An offer refused with NOT_CONNECTED, BACK_PRESSURED or ADMIN_ACTION is retried after a
 * back-off (common.h); any other refusal fails the run. Messages longer than the MTU are
 * fragmented by Aeron. The whole run, connecting included, is bounded by --timeout-s (30).
 * --corrupt-sequence N flips a payload bit of message N after its CRC is computed, so a test can
 * show that the subscriber catches a corrupt message (needs --length above 20).
 *
 * Exit status 0 when every message was accepted, 1 when an offer failed or the time ran out,
 * 2 on a usage or setup error (stderr says which). Prints one JSON line to stdout at the end:
 * {"program", "publisher_id", "stream", "exclusive", "count", "length", "sent", "not_connected",
 *  "back_pressured", "admin_action", "seconds", "ok"}; the three refusal counts are retries.
 */
#define _POSIX_C_SOURCE 200809L

#include "common.h"
#include "message.h"

static const char *const PROGRAM = "aeron_publish";

typedef struct
{
    const char *dir;
    const char *channel;
    int32_t stream;
    long long count;
    uint32_t length;
    uint32_t publisher_id;
    int exclusive;
    long long corrupt_sequence; /* -1: none */
    double timeout_s;
}
options_t;

typedef struct
{
    aeron_publication_t *concurrent;
    aeron_exclusive_publication_t *exclusive;
}
publication_t;

static options_t parse_options(int argc, char **argv)
{
    options_t o = { NULL, "aeron:ipc", -1, -1, 0, 0, 0, -1, 30.0 };
    int have_length = 0, have_id = 0;
    for (int i = 1; i < argc; i++)
    {
        const char *name = argv[i];
        if (strcmp(name, "--dir") == 0)
        {
            o.dir = option_value(PROGRAM, argc, argv, &i);
        }
        else if (strcmp(name, "--channel") == 0)
        {
            o.channel = option_value(PROGRAM, argc, argv, &i);
        }
        else if (strcmp(name, "--stream") == 0)
        {
            o.stream = (int32_t)parse_integer(
                PROGRAM, name, option_value(PROGRAM, argc, argv, &i), INT32_MIN, INT32_MAX);
        }
        else if (strcmp(name, "--count") == 0)
        {
            o.count = parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, INT64_MAX);
        }
        else if (strcmp(name, "--length") == 0)
        {
            o.length = (uint32_t)parse_integer(
                PROGRAM, name, option_value(PROGRAM, argc, argv, &i), MESSAGE_HEADER_LENGTH, INT32_MAX);
            have_length = 1;
        }
        else if (strcmp(name, "--publisher-id") == 0)
        {
            o.publisher_id = (uint32_t)parse_integer(
                PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, UINT32_MAX);
            have_id = 1;
        }
        else if (strcmp(name, "--exclusive") == 0)
        {
            o.exclusive = 1;
        }
        else if (strcmp(name, "--corrupt-sequence") == 0)
        {
            o.corrupt_sequence = parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, INT64_MAX);
        }
        else if (strcmp(name, "--timeout-s") == 0)
        {
            o.timeout_s = (double)parse_integer(
                PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 1, 24 * 3600);
        }
        else
        {
            die(PROGRAM, "unknown option %s", name);
        }
    }
    if (o.dir == NULL || o.stream == -1 || o.count < 0 || !have_length || !have_id)
    {
        die(PROGRAM, "usage: %s --dir DIR --channel aeron:ipc --stream N --count N --length BYTES "
            "--publisher-id N [--exclusive] [--corrupt-sequence N] [--timeout-s S]", PROGRAM);
    }
    if (o.corrupt_sequence >= 0 && o.length == MESSAGE_HEADER_LENGTH)
    {
        die(PROGRAM, "--corrupt-sequence needs a payload: --length above %u", MESSAGE_HEADER_LENGTH);
    }
    return o;
}

/* The publication, once the driver has made it; dies when it refuses or by `deadline`. */
static publication_t add_publication(aeron_t *client, const options_t *o, double deadline)
{
    publication_t p = { NULL, NULL };
    unsigned streak = 0;
    int rc;
    if (o->exclusive)
    {
        aeron_async_add_exclusive_publication_t *async = NULL;
        if (aeron_async_add_exclusive_publication(&async, client, o->channel, o->stream) < 0)
        {
            die(PROGRAM, "add exclusive publication: %s", aeron_errmsg());
        }
        while ((rc = aeron_async_add_exclusive_publication_poll(&p.exclusive, async)) == 0 && now_s() < deadline)
        {
            back_off(&streak);
        }
    }
    else
    {
        aeron_async_add_publication_t *async = NULL;
        if (aeron_async_add_publication(&async, client, o->channel, o->stream) < 0)
        {
            die(PROGRAM, "add publication: %s", aeron_errmsg());
        }
        while ((rc = aeron_async_add_publication_poll(&p.concurrent, async)) == 0 && now_s() < deadline)
        {
            back_off(&streak);
        }
    }
    if (rc < 0)
    {
        die(PROGRAM, "add publication %s stream %d: %s", o->channel, o->stream, aeron_errmsg());
    }
    if (rc == 0)
    {
        die(PROGRAM, "no publication %s stream %d within %.0f s", o->channel, o->stream, o->timeout_s);
    }
    return p;
}

static size_t max_message_length(const publication_t *p)
{
    aeron_publication_constants_t constants;
    const int rc = p->exclusive != NULL ?
        aeron_exclusive_publication_constants(p->exclusive, &constants) :
        aeron_publication_constants(p->concurrent, &constants);
    if (rc < 0)
    {
        die(PROGRAM, "publication constants: %s", aeron_errmsg());
    }
    return constants.max_message_length;
}

static int64_t offer(const publication_t *p, const uint8_t *buffer, size_t length)
{
    return p->exclusive != NULL ?
        aeron_exclusive_publication_offer(p->exclusive, buffer, length, NULL, NULL) :
        aeron_publication_offer(p->concurrent, buffer, length, NULL, NULL);
}

int main(int argc, char **argv)
{
    const options_t o = parse_options(argc, argv);
    const double start = now_s();
    const double deadline = start + o.timeout_s;

    aeron_context_t *context = NULL;
    aeron_t *client = connect_client(PROGRAM, o.dir, &context);
    publication_t publication = add_publication(client, &o, deadline);
    const size_t max_length = max_message_length(&publication);
    if (o.length > max_length)
    {
        die(PROGRAM, "--length %u is above the publication's max message length %zu", o.length, max_length);
    }

    uint8_t *buffer = malloc(o.length);
    if (buffer == NULL)
    {
        die(PROGRAM, "no memory for a %u-byte message", o.length);
    }
    long long sent = 0, not_connected = 0, back_pressured = 0, admin_action = 0;
    int ok = 1;
    for (long long sequence = 0; ok && sequence < o.count; sequence++)
    {
        message_encode(buffer, o.publisher_id, (uint64_t)sequence, o.length);
        if (sequence == o.corrupt_sequence)
        {
            buffer[o.length - 1] ^= 0x01;
        }
        unsigned streak = 0;
        for (;;)
        {
            const int64_t result = offer(&publication, buffer, o.length);
            if (result > 0)
            {
                sent++;
                break;
            }
            if (result == AERON_PUBLICATION_NOT_CONNECTED)
            {
                not_connected++;
            }
            else if (result == AERON_PUBLICATION_BACK_PRESSURED)
            {
                back_pressured++;
            }
            else if (result == AERON_PUBLICATION_ADMIN_ACTION)
            {
                admin_action++;
            }
            else
            {
                fprintf(stderr, "%s: publisher %u: offer of sequence %lld failed with %" PRId64 ": %s\n",
                    PROGRAM, o.publisher_id, sequence, result, aeron_errmsg());
                ok = 0;
                break;
            }
            if (now_s() > deadline)
            {
                fprintf(stderr, "%s: publisher %u: timed out after %.0f s offering sequence %lld "
                    "(%lld of %lld sent; last refusal %" PRId64 ")\n",
                    PROGRAM, o.publisher_id, o.timeout_s, sequence, sent, o.count, result);
                ok = 0;
                break;
            }
            back_off(&streak);
        }
    }

    printf("{\"program\": \"%s\", \"publisher_id\": %u, \"stream\": %d, \"exclusive\": %s, "
        "\"count\": %lld, \"length\": %u, \"sent\": %lld, \"not_connected\": %lld, "
        "\"back_pressured\": %lld, \"admin_action\": %lld, \"seconds\": %.3f, \"ok\": %s}\n",
        PROGRAM, o.publisher_id, o.stream, o.exclusive ? "true" : "false", o.count, o.length, sent,
        not_connected, back_pressured, admin_action, now_s() - start, ok ? "true" : "false");
    fflush(stdout);

    free(buffer);
    if (publication.exclusive != NULL)
    {
        aeron_exclusive_publication_close(publication.exclusive, NULL, NULL);
    }
    else
    {
        aeron_publication_close(publication.concurrent, NULL, NULL);
    }
    aeron_close(client);
    aeron_context_close(context);
    return ok ? 0 : 1;
}
