/*
 * aeron_publish: offers checked messages (message.h), sequence numbers 0, 1, 2, ..., on one
 * Aeron publication (concurrent, or exclusive with --exclusive): `--count` of them, or with
 * --until-stopped as many as it can until SIGTERM or SIGINT (or --seconds).
 *
 *   aeron_publish --dir DIR --channel aeron:ipc --stream N --publisher-id N --length BYTES
 *                 (--count N | --until-stopped [--seconds S] [--hold-s S])
 *                 [--max-length BYTES] [--rate N] [--exclusive] [--corrupt-sequence N]
 *                 [--await-go] [--timeout-s S] [--driver-timeout-ms N]
 *                 [--progress FILE --progress-record OFFSET --progress-phase OFFSET
 *                  [--progress-hold OFFSET]]
 *
 * Message n is --length bytes, or with --max-length a length in [--length, --max-length] that
 * depends only on the publisher id and n. --rate N offers at most N messages a second (0: as
 * many as are accepted). An offer refused with NOT_CONNECTED, BACK_PRESSURED or ADMIN_ACTION
 * is retried after a back-off (common.h); any other refusal fails the run. Messages longer than
 * the MTU are fragmented by Aeron. --corrupt-sequence N flips a bit of the last byte of message
 * N after its CRC is computed (a payload byte; the CRC field's own when the message is only its
 * 20-byte header), so a test can show that a subscriber catches a corrupt message (needs a
 * --length or --max-length above 20).
 *
 * --await-go: once the publication is connected (bounded by --timeout-s), print "READY"
 * (flushed) to stdout and read one line from stdin before the first offer, so a benchmark
 * starts the run once everything is set up. End of input before the line is a setup error; with
 * --until-stopped a stop signal before it ends the run, stopped, with nothing sent.
 *
 * --count N: the whole run, connecting included, is bounded by --timeout-s (30). Exit status 0
 * when every message was accepted, 1 when an offer failed or the time ran out.
 *
 * --until-stopped: offers until the first SIGTERM or SIGINT, or until --seconds pass; only
 * connecting and adding the publication are bounded by --timeout-s, a refused offer is retried
 * until stopped. Then it prints its summary and keeps the publication open for --hold-s (0)
 * seconds or until the next SIGTERM or SIGINT, so subscribers can drain it, and closes. Aeron's
 * client errors are caught (not Aeron's default handler, which exits): when the client ends
 * (the driver's heartbeat lost, the client timed out; common.h client_error_is_end) it prints
 * its summary and exits 3, as when connecting or adding the publication fails (the driver gone
 * or refusing); any other client error, or an offer failing otherwise, exits 1. Exit status 0
 * once stopped. --driver-timeout-ms sets how long the client waits for a silent driver (Aeron's
 * 10 s otherwise).
 *
 * --progress FILE: an existing file, mapped; the program release-stores little-endian i64s at
 * its offsets as it goes (readable after a SIGKILL): at --progress-record, the messages
 * accepted so far (the next sequence number), and 8 bytes after it, the messages attempted (the
 * sequence being offered + 1 while an offer of it is in progress or retried); at
 * --progress-phase, 1 while offering a message (from its first attempt until accepted), 2 while
 * holding a claim (below), else 0. --progress-hold OFFSET: once another process stores a
 * non-zero i64 there, the next message is claimed (aeron_*_try_claim: a frame of the log
 * reserved, its header written, its length not yet), half of it written, and held so, phase 2,
 * until the value is 0 again or 30 s pass (then the claim is aborted: a padding frame, the
 * message not sent) and the value is set back to 0: a process killed holding it leaves a claimed
 * frame the driver must unblock. A message longer than the claim's limit (the MTU's payload) is
 * held as 64 bytes.
 *
 * Exit status 2 on a usage or setup error (stderr says which). Prints one JSON line to stdout at
 * the end: {"program", "publisher_id", "stream", "exclusive", "mode" ("count" or
 * "until-stopped"), "count" (-1 until stopped), "length", "max_length", "rate", "sent",
 * "last_acked" (the last sequence accepted, -1 for none), "not_connected", "back_pressured",
 * "admin_action", "seconds", "first_offer_at", "last_sent_at", "ended" ("count", "stopped",
 * "seconds", "client ended", "client error", "offer failed", "timed out"), "error" (what ended
 * it, or null), "ok"}; the three refusal counts are retries; "seconds" counts from the
 * program's start, connecting included; "first_offer_at" and "last_sent_at" are CLOCK_MONOTONIC
 * seconds (Python's time.monotonic()) at the first offer and just before the accepted offer of
 * the last message accepted (0 when none was).
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
    long long count; /* -1 with --until-stopped */
    int until_stopped;
    double seconds; /* 0: no limit */
    double hold_s;
    uint32_t length;
    uint32_t max_length;
    double rate; /* 0: unpaced */
    uint32_t publisher_id;
    int exclusive;
    long long corrupt_sequence; /* -1: none */
    int await_go;
    double timeout_s;
    long long driver_timeout_ms; /* 0: Aeron's default */
    const char *progress_path;
    long long progress_record;
    long long progress_phase;
    long long progress_hold; /* -1: none */
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
    options_t o = { NULL, "aeron:ipc", -1, -1, 0, 0.0, 0.0, 0, 0, 0.0, 0, 0, -1, 0, 30.0, 0, NULL, -1, -1, -1 };
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
        else if (strcmp(name, "--until-stopped") == 0)
        {
            o.until_stopped = 1;
        }
        else if (strcmp(name, "--seconds") == 0)
        {
            o.seconds = (double)parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 1, 24 * 3600);
        }
        else if (strcmp(name, "--hold-s") == 0)
        {
            o.hold_s = (double)parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, 24 * 3600);
        }
        else if (strcmp(name, "--length") == 0)
        {
            o.length = (uint32_t)parse_integer(
                PROGRAM, name, option_value(PROGRAM, argc, argv, &i), MESSAGE_HEADER_LENGTH, INT32_MAX);
            have_length = 1;
        }
        else if (strcmp(name, "--max-length") == 0)
        {
            o.max_length = (uint32_t)parse_integer(
                PROGRAM, name, option_value(PROGRAM, argc, argv, &i), MESSAGE_HEADER_LENGTH, INT32_MAX);
        }
        else if (strcmp(name, "--rate") == 0)
        {
            o.rate = (double)parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, 100000000);
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
        else if (strcmp(name, "--await-go") == 0)
        {
            o.await_go = 1;
        }
        else if (strcmp(name, "--timeout-s") == 0)
        {
            o.timeout_s = (double)parse_integer(
                PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 1, 24 * 3600);
        }
        else if (strcmp(name, "--driver-timeout-ms") == 0)
        {
            o.driver_timeout_ms = parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 1, 3600000);
        }
        else if (strcmp(name, "--progress") == 0)
        {
            o.progress_path = option_value(PROGRAM, argc, argv, &i);
        }
        else if (strcmp(name, "--progress-record") == 0)
        {
            o.progress_record = parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, INT64_MAX);
        }
        else if (strcmp(name, "--progress-phase") == 0)
        {
            o.progress_phase = parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, INT64_MAX);
        }
        else if (strcmp(name, "--progress-hold") == 0)
        {
            o.progress_hold = parse_integer(PROGRAM, name, option_value(PROGRAM, argc, argv, &i), 0, INT64_MAX);
        }
        else
        {
            die(PROGRAM, "unknown option %s", name);
        }
    }
    if (o.seconds > 0)
    {
        o.until_stopped = 1;
    }
    if (o.dir == NULL || o.stream == -1 || (o.count < 0) == !o.until_stopped || !have_length || !have_id)
    {
        die(PROGRAM, "usage: %s --dir DIR --channel aeron:ipc --stream N --publisher-id N --length BYTES "
            "(--count N | --until-stopped [--seconds S] [--hold-s S]) [--max-length BYTES] [--rate N] "
            "[--exclusive] [--corrupt-sequence N] [--await-go] [--timeout-s S] [--driver-timeout-ms N] "
            "[--progress FILE --progress-record OFFSET --progress-phase OFFSET [--progress-hold OFFSET]]", PROGRAM);
    }
    if (o.max_length == 0)
    {
        o.max_length = o.length;
    }
    if (o.max_length < o.length)
    {
        die(PROGRAM, "--max-length %u is below --length %u", o.max_length, o.length);
    }
    if (o.corrupt_sequence >= 0 && o.max_length == MESSAGE_HEADER_LENGTH)
    {
        die(PROGRAM, "--corrupt-sequence needs a payload: --length or --max-length above %u", MESSAGE_HEADER_LENGTH);
    }
    if (o.progress_path != NULL && (o.progress_record < 0 || o.progress_phase < 0))
    {
        die(PROGRAM, "--progress needs --progress-record and --progress-phase");
    }
    if (o.progress_hold >= 0 && o.progress_path == NULL)
    {
        die(PROGRAM, "--progress-hold needs --progress");
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

static aeron_publication_constants_t publication_constants(const publication_t *p)
{
    aeron_publication_constants_t constants;
    const int rc = p->exclusive != NULL ?
        aeron_exclusive_publication_constants(p->exclusive, &constants) :
        aeron_publication_constants(p->concurrent, &constants);
    if (rc < 0)
    {
        die(PROGRAM, "publication constants: %s", aeron_errmsg());
    }
    return constants;
}

static size_t max_message_length(const publication_t *p)
{
    return publication_constants(p).max_message_length;
}

static size_t max_payload_length(const publication_t *p)
{
    return publication_constants(p).max_payload_length;
}

static int64_t try_claim(const publication_t *p, size_t length, aeron_buffer_claim_t *claim)
{
    return p->exclusive != NULL ?
        aeron_exclusive_publication_try_claim(p->exclusive, length, claim) :
        aeron_publication_try_claim(p->concurrent, length, claim);
}

static int is_connected(const publication_t *p)
{
    return p->exclusive != NULL ?
        aeron_exclusive_publication_is_connected(p->exclusive) :
        aeron_publication_is_connected(p->concurrent);
}

/* --await-go: READY once connected (dies at `deadline`), then one line from stdin; 1 once it
 * came, 0 when a stop signal came first (--until-stopped). Dies at the end of input. */
static int await_go(const publication_t *p, const options_t *o, double deadline)
{
    unsigned streak = 0;
    while (!is_connected(p))
    {
        if (now_s() > deadline)
        {
            die(PROGRAM, "publication %s stream %d not connected within %.0f s", o->channel, o->stream,
                o->timeout_s);
        }
        if (o->until_stopped && stop_signals > 0)
        {
            return 0;
        }
        back_off(&streak);
    }
    printf("READY\n");
    fflush(stdout);
    char line[64];
    while (fgets(line, sizeof(line), stdin) == NULL)
    {
        /* a stop signal interrupts the read (watch_stop_signals does not restart it) */
        if (o->until_stopped && stop_signals > 0)
        {
            return 0;
        }
        if (!ferror(stdin) || errno != EINTR)
        {
            die(PROGRAM, "--await-go: end of input before the go line");
        }
        clearerr(stdin);
    }
    return 1;
}

static int64_t offer(const publication_t *p, const uint8_t *buffer, size_t length)
{
    return p->exclusive != NULL ?
        aeron_exclusive_publication_offer(p->exclusive, buffer, length, NULL, NULL) :
        aeron_publication_offer(p->concurrent, buffer, length, NULL, NULL);
}

/* The length of message `sequence`: in [length, max_length], from the publisher id and the
 * sequence only (splitmix64's finaliser). */
static uint32_t length_of(const options_t *o, uint64_t sequence)
{
    if (o->max_length == o->length)
    {
        return o->length;
    }
    uint64_t z = sequence * 0x9E3779B97F4A7C15ull + o->publisher_id;
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    return o->length + (uint32_t)(z % (uint64_t)(o->max_length - o->length + 1));
}

/* Whether a long-running run is to stop: a stop signal, or --seconds passed. */
static const char *stop_reason(const options_t *o, double start)
{
    if (!o->until_stopped)
    {
        return NULL;
    }
    if (stop_signals > 0)
    {
        return "stopped";
    }
    if (o->seconds > 0 && now_s() - start >= o->seconds)
    {
        return "seconds";
    }
    return NULL;
}

/* What another process asked at --progress-hold (0: nothing). */
static int64_t hold_requested(const options_t *o, const progress_t *progress)
{
    return o->progress_hold >= 0 ? progress_load(progress, o->progress_hold) : 0;
}

/* --progress-hold's claim: message `sequence` claimed, half written and held (phase 2) while
 * the request stands (at most 30 s, or until stopped or the client ends), then aborted; the
 * request is cleared. Nothing is sent. */
static void hold_claim(
    const options_t *o, const publication_t *publication, const progress_t *progress, uint8_t *buffer,
    size_t max_payload_length, long long sequence, double start)
{
    const uint32_t length = length_of(o, (uint64_t)sequence) <= max_payload_length ?
        length_of(o, (uint64_t)sequence) : 64u;
    message_encode(buffer, o->publisher_id, (uint64_t)sequence, length);
    const double deadline = now_s() + 30.0;
    aeron_buffer_claim_t claim;
    progress_store(progress, o->progress_record + 8, sequence + 1);
    while (hold_requested(o, progress) != 0 && now_s() < deadline && stop_reason(o, start) == NULL &&
        !client_error_seen())
    {
        if (try_claim(publication, length, &claim) > 0)
        {
            memcpy(claim.data, buffer, length / 2);
            progress_store(progress, o->progress_phase, 2);
            while (hold_requested(o, progress) != 0 && now_s() < deadline && stop_reason(o, start) == NULL &&
                !client_error_seen())
            {
                sleep_ns(1000000L);
            }
            aeron_buffer_claim_abort(&claim);
            break;
        }
        sleep_ns(1000000L);
    }
    progress_store(progress, o->progress_phase, 0);
    progress_store(progress, o->progress_record + 8, sequence);
    progress_store(progress, o->progress_hold, 0);
}

typedef struct
{
    long long sent;
    long long not_connected;
    long long back_pressured;
    long long admin_action;
    double first_offer_at; /* CLOCK_MONOTONIC s; 0 until the first offer */
    double last_sent_at;   /* of the last message accepted; 0 for none */
    const char *ended; /* NULL while running */
    char error[600];   /* what ended it, empty for none */
    int status;
}
run_t;

/* Offers message `sequence` (`length` bytes in `buffer`) until it is accepted (1), or the run
 * ends first (0: stopped, the client's error seen, the time out; run->ended says which and
 * run->status is set). With `stamp`, run->last_sent_at is the clock read just before the
 * attempt that was accepted: never later than any reader's first sight of the message. */
static int offer_until_accepted(
    const options_t *o, const publication_t *publication, const uint8_t *buffer, uint32_t length,
    long long sequence, double start, double deadline, int stamp, run_t *run)
{
    unsigned streak = 0;
    for (;;)
    {
        const double attempt_at = stamp ? now_s() : 0.0;
        const int64_t result = offer(publication, buffer, length);
        if (result > 0)
        {
            if (stamp)
            {
                run->last_sent_at = attempt_at;
            }
            return 1;
        }
        if (result == AERON_PUBLICATION_NOT_CONNECTED)
        {
            run->not_connected++;
        }
        else if (result == AERON_PUBLICATION_BACK_PRESSURED)
        {
            run->back_pressured++;
        }
        else if (result == AERON_PUBLICATION_ADMIN_ACTION)
        {
            run->admin_action++;
        }
        /* the conductor closes the publication just before it reports the client's end */
        else if (!(o->until_stopped && result == AERON_PUBLICATION_CLOSED && client_error_within(1.0)))
        {
            run->ended = "offer failed";
            snprintf(run->error, sizeof(run->error), "publisher %u: offer of sequence %lld failed with %" PRId64 ": %s",
                o->publisher_id, sequence, result, aeron_errmsg());
            run->status = 1;
            return 0;
        }
        if (o->until_stopped && client_error_seen())
        {
            return 0;
        }
        if (!o->until_stopped && now_s() > deadline)
        {
            run->ended = "timed out";
            snprintf(run->error, sizeof(run->error), "publisher %u: timed out after %.0f s offering sequence %lld "
                "(%lld of %lld sent; last refusal %" PRId64 ")",
                o->publisher_id, o->timeout_s, sequence, run->sent, o->count, result);
            run->status = 1;
            return 0;
        }
        if ((run->ended = stop_reason(o, start)) != NULL)
        {
            return 0;
        }
        back_off(&streak);
    }
}

static void print_summary(const options_t *o, const run_t *run, double seconds)
{
    printf("{\"program\": \"%s\", \"publisher_id\": %u, \"stream\": %d, \"exclusive\": %s, \"mode\": \"%s\", "
        "\"count\": %lld, \"length\": %u, \"max_length\": %u, \"rate\": %.0f, \"sent\": %lld, \"last_acked\": %lld, "
        "\"not_connected\": %lld, \"back_pressured\": %lld, \"admin_action\": %lld, \"seconds\": %.3f, "
        "\"first_offer_at\": %.9f, \"last_sent_at\": %.9f, \"ended\": \"%s\", \"error\": ",
        PROGRAM, o->publisher_id, o->stream, o->exclusive ? "true" : "false",
        o->until_stopped ? "until-stopped" : "count", o->count, o->length, o->max_length, o->rate, run->sent,
        run->sent - 1, run->not_connected, run->back_pressured, run->admin_action, seconds, run->first_offer_at,
        run->last_sent_at, run->ended != NULL ? run->ended : "?");
    if (run->error[0] != '\0')
    {
        print_json_string(stdout, run->error, strlen(run->error));
    }
    else
    {
        printf("null");
    }
    printf(", \"ok\": %s}\n", run->status == 0 ? "true" : "false");
    fflush(stdout);
}

int main(int argc, char **argv)
{
    const options_t o = parse_options(argc, argv);
    const double start = now_s();
    const double deadline = start + o.timeout_s;
    progress_t progress = progress_open(PROGRAM, o.progress_path);
    progress_check_offset(PROGRAM, &progress, "--progress-record", o.progress_record);
    progress_check_offset(PROGRAM, &progress, "--progress-record + 8", o.progress_record + 8);
    progress_check_offset(PROGRAM, &progress, "--progress-phase", o.progress_phase);
    if (o.progress_hold >= 0)
    {
        progress_check_offset(PROGRAM, &progress, "--progress-hold", o.progress_hold);
    }
    if (o.until_stopped)
    {
        watch_stop_signals(PROGRAM);
        setup_failure_status = EXIT_CLIENT_ENDED;
    }

    aeron_context_t *context = NULL;
    aeron_t *client = connect_client_to(PROGRAM, o.dir, &context, o.until_stopped, o.driver_timeout_ms);
    publication_t publication = add_publication(client, &o, deadline);
    const size_t max_length = max_message_length(&publication);
    const size_t max_payload = max_payload_length(&publication);
    if (o.max_length > max_length)
    {
        setup_failure_status = 2;
        die(PROGRAM, "--length or --max-length %u is above the publication's max message length %zu", o.max_length,
            max_length);
    }

    uint8_t *buffer = malloc(o.max_length);
    if (buffer == NULL)
    {
        die(PROGRAM, "no memory for a %u-byte message", o.max_length);
    }
    static run_t run;
    if (o.await_go && !await_go(&publication, &o, deadline))
    {
        run.ended = "stopped";
    }
    while (run.status == 0 && run.ended == NULL)
    {
        if (!o.until_stopped && run.sent == o.count)
        {
            run.ended = "count";
            break;
        }
        if ((run.ended = stop_reason(&o, start)) != NULL || (o.until_stopped && client_error_seen()))
        {
            break;
        }
        if (o.rate > 0 && (double)run.sent > (now_s() - start) * o.rate)
        {
            sleep_ns(1000000L);  /* ahead of the rate: messages go in bursts of up to 1 ms's worth */
            continue;
        }
        const long long sequence = run.sent;
        if (hold_requested(&o, &progress) != 0)
        {
            hold_claim(&o, &publication, &progress, buffer, max_payload, sequence, start);
            continue;
        }
        const uint32_t length = length_of(&o, (uint64_t)sequence);
        message_encode(buffer, o.publisher_id, (uint64_t)sequence, length);
        if (sequence == o.corrupt_sequence)
        {
            buffer[length - 1] ^= 0x01;
        }
        progress_store(&progress, o.progress_record + 8, sequence + 1);
        progress_store(&progress, o.progress_phase, 1);
        if (sequence == 0)
        {
            run.first_offer_at = now_s();
        }
        /* --count: the clock is read for the last message only */
        const int stamp = o.until_stopped || run.sent + 1 == o.count;
        if (offer_until_accepted(&o, &publication, buffer, length, sequence, start, deadline, stamp, &run))
        {
            run.sent++;
            progress_store(&progress, o.progress_record, run.sent);
        }
        progress_store(&progress, o.progress_phase, 0);
    }
    progress_store(&progress, o.progress_record + 8, run.sent);
    const int client_ended = o.until_stopped && run.status == 0 && run.ended == NULL;
    if (client_ended)
    {
        run.ended = client_error_is_end() ? "client ended" : "client error";
        snprintf(run.error, sizeof(run.error), "Aeron client error %d: %s", client_error.code, client_error.message);
        run.status = client_error_is_end() ? EXIT_CLIENT_ENDED : 1;
    }
    if (run.error[0] != '\0')
    {
        fprintf(stderr, "%s: %s\n", PROGRAM, run.error);
    }
    print_summary(&o, &run, now_s() - start);
    free(buffer);
    if (client_ended)
    {
        return run.status;  /* nothing of the client is left to close */
    }

    if (o.until_stopped && run.status == 0)
    {
        const sig_atomic_t signals = stop_signals;
        const double hold_until = now_s() + o.hold_s;
        while (now_s() < hold_until && stop_signals == signals && !client_error_seen())
        {
            sleep_ns(10000000L);
        }
    }
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
    return run.status;
}
