/* rdvpump records: a run of an MQ log's records checked in one call (a replica's frame
 * of copies) or encoded in one call (a producer's batch), and the CRC-32 they carry.
 *
 * The record format is mq/storage/_record.py's (docs/mq-format.md): little-endian
 *     length u32 | crc u32 | offset u64 | timestamp ms u64 | sequence u64
 *     | flags u8 | tag length u8 | producer length u8 | reserved u8
 *     | tag | producer id | body
 * where length counts the whole record and crc is the CRC-32 (zlib's) of every byte
 * after it.
 *
 * As with native/ringbuf.h, native/build_ringbuf.py hands the declarations between
 * the CDEF markers to cffi.
 */
#ifndef RDVPUMP_RECORDS_H
#define RDVPUMP_RECORDS_H

#include <stddef.h>
#include <stdint.h>

/* CDEF-BEGIN */
#define RS_OVERHEAD 36
#define RS_OK 0
#define RS_TRUNCATED 1
#define RS_LENGTH 2
#define RS_CHECKSUM 3
#define RS_FLAGS 4
#define RS_OFFSET 5
#define RS_TIMESTAMP 6
#define RS_BODY 7

/* What stopped a scan (RS_OK: nothing, every byte was a good record), with the fields
 * of the record it stopped at that say why. */
typedef struct {
    int fault;
    /* 1 when every good record's tag and producer id are the first's */
    int same_names;
    uint32_t length;
    uint32_t flags;
    uint32_t body;
    uint64_t offset;
    uint64_t timestamp;
} rs_stop;

/* zlib's crc32(crc, buf, n): the same values, folded with carry-less multiplies where
 * the CPU has them. */
uint32_t rs_crc32(uint32_t crc, const unsigned char *buf, size_t n);
/* The same without the carry-less multiplies (tables only): to test one against the
 * other. */
uint32_t rs_crc32_tables(uint32_t crc, const unsigned char *buf, size_t n);
/* 1 when rs_crc32 folds with carry-less multiplies on this CPU, else 0. */
int rs_crc32_folds(void);

/* zlib's crc32_combine(crc1, crc2, len2): the CRC-32 of A then B from A's (crc1), B's
 * (crc2) and B's length, without reading either again. */
uint32_t rs_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2);

/* Encode `count` records back to back into `out`, which holds them all (the sum of
 * `sizes` and `count` times RS_OVERHEAD + tag_len + producer_len bytes): record i at
 * offset first + i, with timestamp `ts`, sequence `sequence` + i, no flags, the names
 * `names` (tag_len bytes of tag, then producer_len of producer id) and for body the
 * next sizes[i] bytes of `bodies` (the bodies back to back).  ends[i] gets where
 * record i ends in `out`; *crc (the running CRC-32 of what the segment holds before
 * them) is carried on over every byte written.  Returns the bytes written. */
size_t rs_encode(unsigned char *out, const unsigned char *bodies, const uint32_t *sizes,
                 size_t count, const unsigned char *names, uint32_t tag_len,
                 uint32_t producer_len, uint64_t first, uint64_t ts, uint64_t sequence,
                 uint32_t *crc, uint64_t *ends);

/* Check the records back to back in buf[0..n) in order, as a replica stores copies:
 * each whole, of a length within [overhead + its names, max_record], its checksum
 * right, no flags, its offset `expected` then one more each, its timestamp no lower
 * than `min_ts` nor the one before, its body at most max_body.  For record i (at most
 * maxn of them): ends[i] gets where it ends, bodies[i] where its body starts, ts[i]
 * its timestamp, seqs[i] its sequence.  Returns how many records are good, in a row
 * from the start; *stop says what stopped it (RS_OK at the end of buf or after maxn
 * records) and, for a fault, the fields read of the record there. */
size_t rs_scan(const unsigned char *buf, size_t n, uint32_t max_record, uint32_t max_body,
               uint64_t expected, uint64_t min_ts, uint64_t *ends, uint64_t *bodies,
               uint64_t *ts, uint64_t *seqs, size_t maxn, rs_stop *stop);
/* CDEF-END */

#endif
