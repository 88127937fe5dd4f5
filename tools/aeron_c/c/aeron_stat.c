/*
 * aeron_stat: what AeronStat shows, once, as JSON lines: the CnC file of a driver directory,
 * then each allocated counter.
 *
 *   aeron_stat --dir DIR [--timeout-s S]
 *
 * Reads through aeron_cnc_init (waiting up to --timeout-s (10) for a usable cnc.dat),
 * aeron_cnc_constants, aeron_cnc_counters_reader and aeron_counters_reader_foreach_counter.
 * The first line is {"cnc_version": int, "cnc_version_text": "major.minor.patch", "pid",
 * "start_timestamp_ms", "client_liveness_timeout_ns", "to_driver_heartbeat_ms"}; then one line
 * per counter {"id", "type_id", "value", "registration_id", "owner_id", "label"}.
 * Exit status 0, or 2 with Aeron's error on stderr when the CnC file cannot be read.
 */
#define _POSIX_C_SOURCE 200809L

#include "common.h"

static const char *const PROGRAM = "aeron_stat";

static void on_counter(
    int64_t value,
    int32_t id,
    int32_t type_id,
    const uint8_t *key,
    size_t key_length,
    const char *label,
    size_t label_length,
    void *clientd)
{
    (void)key;
    (void)key_length;
    aeron_counters_reader_t *reader = (aeron_counters_reader_t *)clientd;
    int64_t registration_id = -1, owner_id = -1;
    aeron_counters_reader_counter_registration_id(reader, id, &registration_id);
    aeron_counters_reader_counter_owner_id(reader, id, &owner_id);
    printf("{\"id\": %d, \"type_id\": %d, \"value\": %" PRId64 ", \"registration_id\": %" PRId64
        ", \"owner_id\": %" PRId64 ", \"label\": ", id, type_id, value, registration_id, owner_id);
    print_json_string(stdout, label, label_length);
    printf("}\n");
}

int main(int argc, char **argv)
{
    const char *dir = NULL;
    long long timeout_s = 10;
    for (int i = 1; i < argc; i++)
    {
        if (strcmp(argv[i], "--dir") == 0)
        {
            dir = option_value(PROGRAM, argc, argv, &i);
        }
        else if (strcmp(argv[i], "--timeout-s") == 0)
        {
            timeout_s = parse_integer(PROGRAM, "--timeout-s", option_value(PROGRAM, argc, argv, &i), 0, 3600);
        }
        else
        {
            die(PROGRAM, "unknown option %s", argv[i]);
        }
    }
    if (dir == NULL)
    {
        die(PROGRAM, "usage: %s --dir DIR [--timeout-s S]", PROGRAM);
    }

    aeron_cnc_t *cnc = NULL;
    if (aeron_cnc_init(&cnc, dir, (int64_t)timeout_s * 1000) < 0)
    {
        die(PROGRAM, "aeron_cnc_init (dir %s): %s", dir, aeron_errmsg());
    }
    aeron_cnc_constants_t constants;
    if (aeron_cnc_constants(cnc, &constants) < 0)
    {
        die(PROGRAM, "aeron_cnc_constants: %s", aeron_errmsg());
    }
    const int32_t version = constants.cnc_version;
    printf("{\"cnc_version\": %d, \"cnc_version_text\": \"%d.%d.%d\", \"pid\": %" PRId64
        ", \"start_timestamp_ms\": %" PRId64 ", \"client_liveness_timeout_ns\": %" PRId64
        ", \"to_driver_heartbeat_ms\": %" PRId64 "}\n",
        version, (version >> 16) & 0xFF, (version >> 8) & 0xFF, version & 0xFF, constants.pid,
        constants.start_timestamp, constants.client_liveness_timeout, aeron_cnc_to_driver_heartbeat(cnc));

    aeron_counters_reader_t *reader = aeron_cnc_counters_reader(cnc);
    aeron_counters_reader_foreach_counter(reader, on_counter, reader);
    fflush(stdout);
    aeron_cnc_close(cnc);
    return 0;
}
