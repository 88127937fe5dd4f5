/*
 * The checked message the test programs exchange (tools/aeron_c/message.py has the same format
 * in Python). Little-endian:
 *
 *   @0   u32  publisher id
 *   @4   u32  length of the whole message (>= MESSAGE_HEADER_LENGTH)
 *   @8   u64  sequence number of the message within its publisher: 0, 1, 2, ...
 *   @16  u32  CRC-32 (zlib's, IEEE polynomial) of bytes [20, length)
 *   @20  payload: byte i (i counted from the start of the message) is
 *        (sequence * 31 + i + publisher id) & 0xFF
 */
#ifndef SHMBUS_TEST_AERON_C_MESSAGE_H
#define SHMBUS_TEST_AERON_C_MESSAGE_H

#include <stddef.h>
#include <stdint.h>

#define MESSAGE_HEADER_LENGTH 20u

static inline uint32_t message_get_u32(const uint8_t *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t message_get_u64(const uint8_t *p)
{
    return (uint64_t)message_get_u32(p) | (uint64_t)message_get_u32(p + 4) << 32;
}

static inline void message_put_u32(uint8_t *p, uint32_t value)
{
    for (int i = 0; i < 4; i++)
    {
        p[i] = (uint8_t)(value >> (8 * i));
    }
}

static inline void message_put_u64(uint8_t *p, uint64_t value)
{
    message_put_u32(p, (uint32_t)value);
    message_put_u32(p + 4, (uint32_t)(value >> 32));
}

/* CRC-32 as zlib.crc32: reflected polynomial 0xEDB88320, initial and final XOR 0xFFFFFFFF. */
static inline uint32_t message_crc32(const uint8_t *data, size_t length)
{
    static uint32_t table[256];
    static int table_ready = 0;
    if (!table_ready)
    {
        for (uint32_t n = 0; n < 256; n++)
        {
            uint32_t c = n;
            for (int k = 0; k < 8; k++)
            {
                c = (c & 1u) ? 0xEDB88320u ^ (c >> 1) : c >> 1;
            }
            table[n] = c;
        }
        table_ready = 1;
    }
    uint32_t crc = 0xFFFFFFFFu;
    for (size_t i = 0; i < length; i++)
    {
        crc = table[(crc ^ data[i]) & 0xFFu] ^ (crc >> 8);
    }
    return crc ^ 0xFFFFFFFFu;
}

/* Writes message `sequence` of `publisher_id`, `length` bytes (>= MESSAGE_HEADER_LENGTH), into
 * `buffer`. */
static inline void message_encode(uint8_t *buffer, uint32_t publisher_id, uint64_t sequence, uint32_t length)
{
    const uint32_t base = (uint32_t)(sequence * 31u) + publisher_id;
    for (uint32_t i = MESSAGE_HEADER_LENGTH; i < length; i++)
    {
        buffer[i] = (uint8_t)(base + i);
    }
    message_put_u32(buffer, publisher_id);
    message_put_u32(buffer + 4, length);
    message_put_u64(buffer + 8, sequence);
    message_put_u32(buffer + 16, message_crc32(buffer + MESSAGE_HEADER_LENGTH, length - MESSAGE_HEADER_LENGTH));
}

/* NULL when the `length` bytes at `buffer` are a whole, intact message (then its publisher id
 * and sequence number are in *publisher_id and *sequence), else what is wrong with them. Checks
 * the length field, the CRC and every payload byte. */
static inline const char *message_check(
    const uint8_t *buffer, size_t length, uint32_t *publisher_id, uint64_t *sequence)
{
    if (length < MESSAGE_HEADER_LENGTH)
    {
        return "shorter than the 20-byte message header";
    }
    *publisher_id = message_get_u32(buffer);
    *sequence = message_get_u64(buffer + 8);
    if (message_get_u32(buffer + 4) != length)
    {
        return "length field differs from the length received";
    }
    if (message_get_u32(buffer + 16) != message_crc32(buffer + MESSAGE_HEADER_LENGTH, length - MESSAGE_HEADER_LENGTH))
    {
        return "CRC-32 of the payload differs from the CRC field";
    }
    const uint32_t base = (uint32_t)(*sequence * 31u) + *publisher_id;
    for (size_t i = MESSAGE_HEADER_LENGTH; i < length; i++)
    {
        if (buffer[i] != (uint8_t)(base + (uint32_t)i))
        {
            return "payload differs from the pattern of its publisher id and sequence";
        }
    }
    return NULL;
}

#endif
