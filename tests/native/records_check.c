/* Exercises native/records.c for valgrind / ASan: the CRC folded and by tables agree, and
 * a frame of records scans whole, cut at every byte (in a buffer just that long, so that
 * a read past its end is caught) and with any byte flipped.  Exit status 0 when every
 * result matched. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check.h"
#include "records.h"

static void put32(unsigned char *p, uint32_t v) {
    for (int i = 0; i < 4; i++) p[i] = (unsigned char)(v >> (8 * i));
}

static void put64(unsigned char *p, uint64_t v) {
    for (int i = 0; i < 8; i++) p[i] = (unsigned char)(v >> (8 * i));
}

/* One record at p (offset, timestamp, a tag of tag_len 't's, producer "pp", body_len
 * bytes): its length. */
static size_t record(unsigned char *p, uint64_t offset, uint64_t ts, unsigned tag_len,
                     unsigned body_len) {
    size_t length = RS_OVERHEAD + tag_len + 2 + body_len;
    memset(p, 0, RS_OVERHEAD);
    put32(p, (uint32_t)length);
    put64(p + 8, offset);
    put64(p + 16, ts);
    put64(p + 24, offset * 3);
    p[33] = (unsigned char)tag_len;
    p[34] = 2;
    memset(p + RS_OVERHEAD, 't', tag_len);
    memcpy(p + RS_OVERHEAD + tag_len, "pp", 2);
    for (unsigned i = 0; i < body_len; i++) p[RS_OVERHEAD + tag_len + 2 + i] = (unsigned char)rnd(256);
    put32(p + 4, rs_crc32_tables(0, p + 8, length - 8));
    return length;
}

#define MAXN 64

static int scan(const unsigned char *buf, size_t n, size_t *count, rs_stop *stop) {
    uint64_t ends[MAXN], bodies[MAXN];
    uint64_t ts[MAXN], seqs[MAXN];
    unsigned char *copy = malloc(n ? n : 1); /* exactly n bytes: ASan sees any overread */
    CHECK(copy != NULL);
    memcpy(copy, buf, n);
    *count = rs_scan(copy, n, 1 << 20, 1 << 20, 100, 7, ends, bodies, ts, seqs, MAXN, stop);
    for (size_t i = 0; i < *count; i++) CHECK(seqs[i] == (100 + i) * 3 && bodies[i] < ends[i]);
    free(copy);
    return 0;
}

int main(void) {
    unsigned char data[8192];
    for (int t = 0; t < 2000; t++) {
        size_t n = rnd(3000);
        for (size_t i = 0; i < n; i++) data[i] = (unsigned char)rnd(256);
        uint32_t c = rnd(2) ? (uint32_t)rnd(1u << 31) : 0;
        CHECK(rs_crc32(c, data, n) == rs_crc32_tables(c, data, n));
    }
    size_t total = 0, starts[12], count;
    for (int i = 0; i < 12; i++) {
        starts[i] = total;
        total += record(data + total, 100 + (uint64_t)i, 7 + (uint64_t)i / 3, rnd(3), rnd(300));
    }
    rs_stop stop;
    CHECK(scan(data, total, &count, &stop) == 0);
    CHECK(count == 12 && stop.fault == RS_OK && stop.same_names == 0);
    for (size_t cut = 0; cut < total; cut++) {
        CHECK(scan(data, cut, &count, &stop) == 0);
        size_t whole = 0;
        while (whole < 12 && starts[whole] + (whole + 1 < 12 ? starts[whole + 1] - starts[whole]
                                                           : total - starts[whole]) <= cut) {
            whole++;
        }
        CHECK(count == whole);
        CHECK(stop.fault == (cut == starts[whole] ? RS_OK : RS_TRUNCATED));
    }
    for (size_t at = 0; at < total; at++) {
        data[at] ^= 0x5a;
        CHECK(scan(data, total, &count, &stop) == 0);
        CHECK(count < 12 && stop.fault != RS_OK);
        data[at] ^= 0x5a;
    }
    puts("records_check: ok");
    return 0;
}
