/*
 * message_probe: message.h's encoder and checker from the command line, so a test can compare
 * them with the Python ones (tools/aeron_c/message.py) byte for byte. Needs no Aeron.
 *
 *   message_probe encode PUBLISHER_ID SEQUENCE LENGTH   prints the message as hex
 *   message_probe check HEX                              prints {"publisher_id", "sequence"} of an
 *                                                        intact message, else {"error": "..."}
 *
 * Exit status 0 for an encoded or intact message, 1 for a message the checker refuses, 2 on a
 * usage error.
 */
#define _POSIX_C_SOURCE 200809L

#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "message.h"

static int usage(void)
{
    fprintf(stderr, "usage: message_probe encode PUBLISHER_ID SEQUENCE LENGTH | check HEX\n");
    return 2;
}

static int encode(const char *id_text, const char *sequence_text, const char *length_text)
{
    const unsigned long long id = strtoull(id_text, NULL, 10);
    const unsigned long long sequence = strtoull(sequence_text, NULL, 10);
    const unsigned long length = strtoul(length_text, NULL, 10);
    if (id > UINT32_MAX || length < MESSAGE_HEADER_LENGTH || length > (1ul << 26))
    {
        return usage();
    }
    uint8_t *buffer = malloc(length);
    if (buffer == NULL)
    {
        return 2;
    }
    message_encode(buffer, (uint32_t)id, (uint64_t)sequence, (uint32_t)length);
    for (unsigned long i = 0; i < length; i++)
    {
        printf("%02x", buffer[i]);
    }
    printf("\n");
    free(buffer);
    return 0;
}

static int check(const char *hex)
{
    const size_t digits = strlen(hex);
    if (digits % 2 != 0)
    {
        return usage();
    }
    const size_t length = digits / 2;
    uint8_t *buffer = malloc(length + 1);
    if (buffer == NULL)
    {
        return 2;
    }
    for (size_t i = 0; i < length; i++)
    {
        unsigned int byte;
        if (sscanf(hex + 2 * i, "%2x", &byte) != 1)
        {
            free(buffer);
            return usage();
        }
        buffer[i] = (uint8_t)byte;
    }
    uint32_t id = 0;
    uint64_t sequence = 0;
    const char *problem = message_check(buffer, length, &id, &sequence);
    free(buffer);
    if (problem != NULL)
    {
        printf("{\"error\": \"%s\"}\n", problem);
        return 1;
    }
    printf("{\"publisher_id\": %" PRIu32 ", \"sequence\": %" PRIu64 "}\n", id, sequence);
    return 0;
}

int main(int argc, char **argv)
{
    if (argc == 5 && strcmp(argv[1], "encode") == 0)
    {
        return encode(argv[2], argv[3], argv[4]);
    }
    if (argc == 3 && strcmp(argv[1], "check") == 0)
    {
        return check(argv[2]);
    }
    return usage();
}
