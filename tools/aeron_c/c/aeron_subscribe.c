/*
 * aeron_subscribe: receives checked messages (message.h) on one Aeron subscription and checks
 * them, in one of two modes.
 *
 *   aeron_subscribe --dir DIR --channel aeron:ipc --stream N
 *                   (--expect PUBLISHER_ID:COUNT ... | --until-stopped [--seconds S])
 *                   [--await-images N] [--delay-us N] [--timeout-s S] [--driver-timeout-ms N]
 *                   [--progress FILE --progress-record OFFSET --progress-phase OFFSET]
 *
 * --expect: each expected publisher's messages arrive whole and in order, sequence numbers 0, 1,
 * 2, ... up to its COUNT, nothing lost, duplicated or reordered, every length and CRC right. The
 * whole run is bounded by --timeout-s (30). Exit status 0 once every expected publisher's COUNT
 * messages arrived intact; 1 at the first message that breaks a rule (from a publisher not
 * expected, past its COUNT, out of sequence, corrupt) or when the time runs out.
 *
 * --until-stopped: reads until the first SIGTERM or SIGINT (or until --seconds pass) from any
 * publisher, and checks that within one image every message is intact (length, CRC, payload
 * pattern) and each publisher's sequence numbers go up by one from the first it sees there: a
 * subscriber that joins late, or a new image (another Aeron image: the header's context), starts
 * wherever the stream is, and the jump from the last one seen in the image before is *skipped*
 * (counted, allowed); going back at a new image is a duplicate. Only connecting, adding the
 * subscription and --await-images are bounded by --timeout-s. Aeron's client errors are caught
 * (not Aeron's default handler, which exits): when the client ends (the driver's heartbeat lost,
 * the client timed out; common.h client_error_is_end) it prints its summary and exits 3, as
 * when connecting or adding the subscription fails (the driver gone or refusing); any other
 * client error exits 1. Exit status 0 once stopped; 1 at the first message that breaks a rule.
 * --driver-timeout-ms sets how long the client waits for a silent driver (Aeron's 10 s
 * otherwise).
 *
 * In both modes a breach is named on stderr and in the summary: the publisher, the expected and
 * the got sequence. Fragments are reassembled with aeron_fragment_assembler. Prints "READY"
 * (flushed) to stdout once the subscription is added and it has at least --await-images (0)
 * images. --delay-us sleeps after each message (a slow subscriber).
 *
 * --progress FILE: an existing file, mapped; the program release-stores little-endian i64s at
 * its offsets as it goes (readable after a SIGKILL): at --progress-record the messages checked
 * so far, at --progress-phase 1 while it is inside a poll, else 0.
 *
 * Exit status 2 on a usage or setup error (stderr says which). Prints one JSON line to stdout at
 * the end: {"program", "stream", "mode" ("expect" or "until-stopped"), "expected": {id: count},
 * "received": {id: count}, "publishers": {id: {"session", "received", "first", "last",
 * "skipped", "images"}}, "messages", "bytes", "errors", "error", "ended" ("all arrived",
 * "broken rule", "timed out", "stopped", "seconds", "client ended", "client error", "poll
 * failed"), "seconds", "first_message_at", "last_message_at", "ok"}: "seconds" counts from the
 * program's start, connecting included; "first_message_at" and "last_message_at" are
 * CLOCK_MONOTONIC seconds (Python's time.monotonic()) when the first and the last message that
 * passed the checks came (0 when none did).
 */
#define _POSIX_C_SOURCE 200809L

#include "common.h"
#include "message.h"

static const char *const PROGRAM = "aeron_subscribe";

#define MAX_EXPECTED 64
#define MAX_PUBLISHERS 4096

typedef struct
{
    uint32_t id;
    long long expected;  /* --expect's count; -1 until stopped */
    long long received;
    long long first;     /* the first sequence seen */
    long long last;      /* the last sequence seen */
    long long skipped;   /* sequences jumped over between images */
    long long images;    /* images it was read from */
    int64_t image;       /* the correlation id of the image it is read from now */
    int32_t session_id;
}
publisher_t;

typedef struct
{
    const char *dir;
    const char *channel;
    int32_t stream;
    int until_stopped;
    double seconds; /* 0: no limit */
    int await_images;
    long delay_us;
    double timeout_s;
    long long driver_timeout_ms; /* 0: Aeron's default */
    const char *progress_path;
    long long progress_record;
    long long progress_phase;
    progress_t progress;
    publisher_t publishers[MAX_PUBLISHERS];
    int publisher_count;
    int last_found; /* the index of the publisher of the last message (most come in runs) */
    long long messages;
    long long bytes;
    double first_message_at;
    double last_message_at;
    const char *ended;
    char error[512]; /* the first failure; empty while there is none */
}
state_t;

static void parse_expect(state_t *s, const char *text)
{
    const char *colon = strchr(text, ':');
    if (colon == NULL || colon == text || s->publisher_count == MAX_EXPECTED)
    {
        die(PROGRAM, "--expect: expected PUBLISHER_ID:COUNT (at most %d), got '%s'", MAX_EXPECTED, text);
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
    p->first = p->last = -1;
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
        else if (strcmp(name, "--until-stopped") == 0)
        {
            s->until_stopped = 1;
        }
        else if (strcmp(name, "--seconds") == 0)
        {
            s->seconds = (double)parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 1, 24 * 3600);
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
        else if (strcmp(name, "--driver-timeout-ms") == 0)
        {
            s->driver_timeout_ms = parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 1, 3600000);
        }
        else if (strcmp(name, "--progress") == 0)
        {
            s->progress_path = option_value(PROGRAM, argc, argv, &i);
        }
        else if (strcmp(name, "--progress-record") == 0)
        {
            s->progress_record = parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, INT64_MAX);
        }
        else if (strcmp(name, "--progress-phase") == 0)
        {
            s->progress_phase = parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, INT64_MAX);
        }
        else
        {
            die(PROGRAM, "unknown option %s", name);
        }
    }
    if (s->seconds > 0)
    {
        s->until_stopped = 1;
    }
    if (s->dir == NULL || s->stream == -1 || (s->publisher_count == 0) == !s->until_stopped)
    {
        die(PROGRAM, "usage: %s --dir DIR --channel aeron:ipc --stream N (--expect PUBLISHER_ID:COUNT ... | "
            "--until-stopped [--seconds S]) [--await-images N] [--delay-us N] [--timeout-s S] "
            "[--driver-timeout-ms N] [--progress FILE --progress-record OFFSET --progress-phase OFFSET]", PROGRAM);
    }
    if (s->progress_path != NULL && (s->progress_record < 0 || s->progress_phase < 0))
    {
        die(PROGRAM, "--progress needs --progress-record and --progress-phase");
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
    if (s->until_stopped)
    {
        return 0;
    }
    for (int i = 0; i < s->publisher_count; i++)
    {
        if (s->publishers[i].received < s->publishers[i].expected)
        {
            return 0;
        }
    }
    return 1;
}

/* The publisher `id`, looked for from the last one found and then from the newest back (a new
 * publisher is added at the end); NULL if unknown. */
static publisher_t *find_publisher(state_t *s, uint32_t id)
{
    if (s->publisher_count > 0 && s->publishers[s->last_found].id == id)
    {
        return &s->publishers[s->last_found];
    }
    for (int i = s->publisher_count - 1; i >= 0; i--)
    {
        if (s->publishers[i].id == id)
        {
            s->last_found = i;
            return &s->publishers[i];
        }
    }
    return NULL;
}

/* --expect's rules for one intact message of publisher `id`. */
static void check_expected(state_t *s, uint32_t id, uint64_t sequence)
{
    publisher_t *p = find_publisher(s, id);
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
    if (p->received == 0)
    {
        p->first = 0;
    }
    p->last = (long long)sequence;
    p->received++;
}

/* --until-stopped's rule for one intact message of publisher `id`: within an image, one more
 * than the last; at a new image, anything after the last. */
static void check_image(state_t *s, uint32_t id, uint64_t sequence, aeron_header_t *header)
{
    aeron_image_t *image = (aeron_image_t *)aeron_header_context(header);
    aeron_image_constants_t constants;
    if (image == NULL || aeron_image_constants(image, &constants) < 0)
    {
        fail(s, "publisher %u: sequence %" PRIu64 " came with no image: %s", id, sequence, aeron_errmsg());
        return;
    }
    publisher_t *p = find_publisher(s, id);
    if (p == NULL)
    {
        if (s->publisher_count == MAX_PUBLISHERS)
        {
            fail(s, "publisher %u: more than %d publishers", id, MAX_PUBLISHERS);
            return;
        }
        s->last_found = s->publisher_count++;
        p = &s->publishers[s->last_found];
        p->id = id;
        p->expected = -1;
        p->first = (long long)sequence;
        p->images = 1;
    }
    else if (p->image != constants.correlation_id)
    {
        if (sequence <= (uint64_t)p->last)
        {
            fail(s, "publisher %u: sequence %" PRIu64 " at the start of a new image (session %d), after sequence "
                "%lld in the image before (duplicated)", id, sequence, constants.session_id, p->last);
            return;
        }
        p->skipped += (long long)sequence - p->last - 1;
        p->images++;
    }
    else if (sequence != (uint64_t)p->last + 1)
    {
        fail(s, "publisher %u: expected sequence %lld, got sequence %" PRIu64 " within one image (session %d) (%s)",
            id, p->last + 1, sequence, constants.session_id,
            sequence > (uint64_t)p->last + 1 ? "lost" : "duplicated or reordered");
        return;
    }
    p->image = constants.correlation_id;
    p->session_id = constants.session_id;
    p->last = (long long)sequence;
    p->received++;
}

/* The handler of whole (reassembled) messages. */
static void on_message(void *clientd, const uint8_t *buffer, size_t length, aeron_header_t *header)
{
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
    if (s->until_stopped)
    {
        check_image(s, id, sequence, header);
    }
    else
    {
        check_expected(s, id, sequence);
    }
    if (s->error[0] != '\0')
    {
        return;
    }
    s->messages++;
    s->bytes += (long long)length;
    s->last_message_at = now_s();
    if (s->messages == 1)
    {
        s->first_message_at = s->last_message_at;
    }
    progress_store(&s->progress, s->progress_record, s->messages);
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
    printf("{\"program\": \"%s\", \"stream\": %d, \"mode\": \"%s\", \"expected\": {", PROGRAM, s->stream,
        s->until_stopped ? "until-stopped" : "expect");
    for (int i = 0, n = 0; i < s->publisher_count; i++)
    {
        if (s->publishers[i].expected >= 0)
        {
            printf("%s\"%u\": %lld", n++ ? ", " : "", s->publishers[i].id, s->publishers[i].expected);
        }
    }
    printf("}, \"received\": {");
    for (int i = 0; i < s->publisher_count; i++)
    {
        printf("%s\"%u\": %lld", i ? ", " : "", s->publishers[i].id, s->publishers[i].received);
    }
    printf("}, \"publishers\": {");
    for (int i = 0; i < s->publisher_count; i++)
    {
        const publisher_t *p = &s->publishers[i];
        printf("%s\"%u\": {\"session\": %d, \"received\": %lld, \"first\": %lld, \"last\": %lld, \"skipped\": %lld, "
            "\"images\": %lld}", i ? ", " : "", p->id, p->session_id, p->received, p->first, p->last, p->skipped,
            p->images);
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
    printf(", \"ended\": \"%s\", \"seconds\": %.3f, \"first_message_at\": %.9f, \"last_message_at\": %.9f, "
        "\"ok\": %s}\n", s->ended != NULL ? s->ended : "?", seconds, s->first_message_at, s->last_message_at,
        s->error[0] == '\0' ? "true" : "false");
    fflush(stdout);
}

/* Why a long-running run is to stop now (a stop signal, --seconds passed, the client's end
 * reported), or NULL. */
static const char *stop_reason(const state_t *s, double start)
{
    if (stop_signals > 0)
    {
        return "stopped";
    }
    if (s->seconds > 0 && now_s() - start >= s->seconds)
    {
        return "seconds";
    }
    if (client_error_seen())
    {
        return client_error_is_end() ? "client ended" : "client error";
    }
    return NULL;
}

int main(int argc, char **argv)
{
    static state_t s;
    s.channel = "aeron:ipc";
    s.stream = -1;
    s.timeout_s = 30.0;
    s.progress_record = s.progress_phase = -1;
    parse_options(&s, argc, argv);
    const double start = now_s();
    const double deadline = start + s.timeout_s;
    s.progress = progress_open(PROGRAM, s.progress_path);
    progress_check_offset(PROGRAM, &s.progress, "--progress-record", s.progress_record);
    progress_check_offset(PROGRAM, &s.progress, "--progress-phase", s.progress_phase);
    if (s.until_stopped)
    {
        watch_stop_signals(PROGRAM);
        setup_failure_status = EXIT_CLIENT_ENDED;
    }

    aeron_context_t *context = NULL;
    aeron_t *client = connect_client_to(PROGRAM, s.dir, &context, s.until_stopped, s.driver_timeout_ms);
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
        setup_failure_status = 2;
        die(PROGRAM, "fragment assembler: %s", aeron_errmsg());
    }
    streak = 0;
    while (s.error[0] == '\0' && !all_arrived(&s))
    {
        if (s.until_stopped && (s.ended = stop_reason(&s, start)) != NULL)
        {
            break;
        }
        if (!s.until_stopped && now_s() > deadline)
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
            s.ended = "timed out";
            break;
        }
        progress_store(&s.progress, s.progress_phase, 1);
        const int fragments = aeron_subscription_poll(subscription, aeron_fragment_assembler_handler, assembler, 64);
        progress_store(&s.progress, s.progress_phase, 0);
        if (fragments < 0)
        {
            if (s.until_stopped && client_error_within(1.0))
            {
                continue;  /* the client's end, reported at the top */
            }
            fail(&s, "poll: %s", aeron_errmsg());
            s.ended = "poll failed";
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
    int status = 0;
    if (s.ended == NULL)
    {
        s.ended = s.error[0] != '\0' ? "broken rule" : "all arrived";
    }
    if (s.error[0] != '\0')
    {
        status = 1;
    }
    else if (s.until_stopped && client_error_seen())
    {
        fail(&s, "Aeron client error %d: %s", client_error.code, client_error.message);
        status = client_error_is_end() ? EXIT_CLIENT_ENDED : 1;
    }
    if (s.error[0] != '\0')
    {
        fprintf(stderr, "%s: %s\n", PROGRAM, s.error);
    }
    print_summary(&s, now_s() - start);
    if (s.until_stopped && client_error_seen())
    {
        return status;  /* nothing of the client is left to close */
    }

    aeron_fragment_assembler_delete(assembler);
    aeron_subscription_close(subscription, NULL, NULL);
    aeron_close(client);
    aeron_context_close(context);
    return status;
}
