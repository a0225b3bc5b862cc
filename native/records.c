/* rdvpump records: see records.h for the contract of every function. */
#include "records.h"

#include <string.h>

/* -- CRC-32 (zlib's: reflected polynomial 0xEDB88320, inverted in and out) -------- */

static uint32_t tables[8][256];
static int tables_ready;

static void make_tables(void) {
    for (uint32_t i = 0; i < 256; i++) {
        uint32_t c = i;
        for (int k = 0; k < 8; k++) c = (c >> 1) ^ (0xEDB88320u & (0u - (c & 1u)));
        tables[0][i] = c;
    }
    for (uint32_t i = 0; i < 256; i++) {
        for (int t = 1; t < 8; t++) {
            tables[t][i] = (tables[t - 1][i] >> 8) ^ tables[0][tables[t - 1][i] & 0xFF];
        }
    }
    tables_ready = 1;
}

static uint32_t load32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static uint64_t load64(const unsigned char *p) {
    return (uint64_t)load32(p) | (uint64_t)load32(p + 4) << 32;
}

/* The register form (not inverted), eight bytes a step. */
static uint32_t crc_tables(uint32_t c, const unsigned char *p, size_t n) {
    if (!tables_ready) make_tables();
    while (n >= 8) {
        uint32_t lo = load32(p) ^ c, hi = load32(p + 4);
        c = tables[7][lo & 0xFF] ^ tables[6][(lo >> 8) & 0xFF] ^ tables[5][(lo >> 16) & 0xFF] ^
            tables[4][lo >> 24] ^ tables[3][hi & 0xFF] ^ tables[2][(hi >> 8) & 0xFF] ^
            tables[1][(hi >> 16) & 0xFF] ^ tables[0][hi >> 24];
        p += 8;
        n -= 8;
    }
    while (n--) c = (c >> 8) ^ tables[0][(c ^ *p++) & 0xFF];
    return c;
}

uint32_t rs_crc32_tables(uint32_t crc, const unsigned char *buf, size_t n) {
    return ~crc_tables(~crc, buf, n);
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>

/* Folding with carry-less multiplies (Gopal, Ozturk et al., "Fast CRC Computation for
 * Generic Polynomials Using PCLMULQDQ Instruction", Intel 2009), in the register
 * form, over n bytes (at least 64, a multiple of 16).  The constants are x^k mod P for
 * the reflected polynomial: k = 4*128+32 and 4*128-32 to fold four lanes 512 bits on,
 * 128+32 and 128-32 to fold one 128 bits on, 64 for the last 64 bits, then Barrett's
 * reduction with P' and mu = x^64 / P. */
__attribute__((target("pclmul,sse4.1"))) static uint32_t crc_fold(uint32_t c,
                                                                   const unsigned char *p,
                                                                   size_t n) {
    const __m128i k1k2 = _mm_set_epi64x(0x1c6e41596LL, 0x154442bd4LL);
    const __m128i k3k4 = _mm_set_epi64x(0x0ccaa009eLL, 0x1751997d0LL);
    const __m128i k5 = _mm_set_epi64x(0, 0x163cd6124LL);
    const __m128i poly_mu = _mm_set_epi64x(0x1f7011641LL, 0x1db710641LL);
    const __m128i mask32 = _mm_set_epi32(0, 0, 0, -1);
    __m128i x0 = _mm_loadu_si128((const __m128i *)p);
    __m128i x1 = _mm_loadu_si128((const __m128i *)(p + 16));
    __m128i x2 = _mm_loadu_si128((const __m128i *)(p + 32));
    __m128i x3 = _mm_loadu_si128((const __m128i *)(p + 48));
    x0 = _mm_xor_si128(x0, _mm_cvtsi32_si128((int)c));
    p += 64;
    n -= 64;
    while (n >= 64) {
#define FOLD(x, k, next)                                                  \
    do {                                                                  \
        __m128i lo_ = _mm_clmulepi64_si128((x), (k), 0x00);               \
        __m128i hi_ = _mm_clmulepi64_si128((x), (k), 0x11);               \
        (x) = _mm_xor_si128(_mm_xor_si128(lo_, hi_), (next));             \
    } while (0)
        FOLD(x0, k1k2, _mm_loadu_si128((const __m128i *)p));
        FOLD(x1, k1k2, _mm_loadu_si128((const __m128i *)(p + 16)));
        FOLD(x2, k1k2, _mm_loadu_si128((const __m128i *)(p + 32)));
        FOLD(x3, k1k2, _mm_loadu_si128((const __m128i *)(p + 48)));
        p += 64;
        n -= 64;
    }
    FOLD(x0, k3k4, x1);
    FOLD(x0, k3k4, x2);
    FOLD(x0, k3k4, x3);
    while (n >= 16) {
        FOLD(x0, k3k4, _mm_loadu_si128((const __m128i *)p));
        p += 16;
        n -= 16;
    }
#undef FOLD
    /* 128 bits to 64 (and 32 zero bits appended), then 64 to 32 */
    __m128i t = _mm_clmulepi64_si128(k3k4, x0, 0x01);
    x0 = _mm_xor_si128(_mm_srli_si128(x0, 8), t);
    t = _mm_srli_si128(x0, 4);
    x0 = _mm_xor_si128(_mm_clmulepi64_si128(_mm_and_si128(x0, mask32), k5, 0x00), t);
    /* Barrett's reduction, bit-reflected */
    t = _mm_clmulepi64_si128(_mm_and_si128(x0, mask32), poly_mu, 0x10);
    t = _mm_clmulepi64_si128(_mm_and_si128(t, mask32), poly_mu, 0x00);
    return (uint32_t)_mm_extract_epi32(_mm_xor_si128(x0, t), 1);
}

static int folds = -1;

int rs_crc32_folds(void) {
    if (folds < 0) {
        __builtin_cpu_init();
        folds = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
    }
    return folds;
}

uint32_t rs_crc32(uint32_t crc, const unsigned char *buf, size_t n) {
    uint32_t c = ~crc;
    if (n >= 64 && rs_crc32_folds()) {
        size_t folded = n & ~(size_t)15;
        c = crc_fold(c, buf, folded);
        buf += folded;
        n -= folded;
    }
    return ~crc_tables(c, buf, n);
}
#else
int rs_crc32_folds(void) { return 0; }

uint32_t rs_crc32(uint32_t crc, const unsigned char *buf, size_t n) {
    return rs_crc32_tables(crc, buf, n);
}
#endif

/* Combining two CRCs (zlib 1.2.12's crc32_combine): multiplications modulo the
 * polynomial, in the reflected form, by x to the power of eight times the length. */
static uint32_t x2n[32];

static uint32_t multmodp(uint32_t a, uint32_t b) {  /* a is never 0 here */
    uint32_t m = (uint32_t)1 << 31, p = 0;
    for (;;) {
        if (a & m) {
            p ^= b;
            if ((a & (m - 1)) == 0) break;
        }
        m >>= 1;
        b = b & 1 ? (b >> 1) ^ 0xEDB88320u : b >> 1;
    }
    return p;
}

/* x^(n * 2^k) modulo the polynomial. */
static uint32_t x2nmodp(uint64_t n, unsigned k) {
    if (!x2n[0]) {
        uint32_t p = (uint32_t)1 << 30;  /* x^1 */
        x2n[0] = p;
        for (int i = 1; i < 32; i++) x2n[i] = p = multmodp(p, p);
    }
    uint32_t p = (uint32_t)1 << 31;  /* x^0 */
    while (n) {
        if (n & 1) p = multmodp(x2n[k & 31], p);
        n >>= 1;
        k++;
    }
    return p;
}

uint32_t rs_crc32_combine(uint32_t crc1, uint32_t crc2, uint64_t len2) {
    return multmodp(x2nmodp(len2, 3), crc1) ^ crc2;
}

static void store32(unsigned char *p, uint32_t v) {
    p[0] = (unsigned char)v;
    p[1] = (unsigned char)(v >> 8);
    p[2] = (unsigned char)(v >> 16);
    p[3] = (unsigned char)(v >> 24);
}

static void store64(unsigned char *p, uint64_t v) {
    store32(p, (uint32_t)v);
    store32(p + 4, (uint32_t)(v >> 32));
}

/* -- a run of records ----------------------------------------------------------------- */

size_t rs_encode(unsigned char *out, const unsigned char *bodies, const uint32_t *sizes,
                 size_t count, const unsigned char *names, uint32_t tag_len,
                 uint32_t producer_len, uint64_t first, uint64_t ts, uint64_t sequence,
                 uint32_t *crc, uint64_t *ends) {
    size_t pos = 0, head = RS_OVERHEAD + tag_len + producer_len;
    uint32_t running = *crc, op = 0;
    uint64_t op_len = 0;
    for (size_t i = 0; i < count; i++) {
        unsigned char *r = out + pos;
        uint32_t length = (uint32_t)(head + sizes[i]);
        store32(r, length);
        store64(r + 8, first + i);
        store64(r + 16, ts);
        store64(r + 24, sequence + i);
        r[32] = 0;
        r[33] = (unsigned char)tag_len;
        r[34] = (unsigned char)producer_len;
        r[35] = 0;
        memcpy(r + RS_OVERHEAD, names, tag_len + producer_len);
        memcpy(r + head, bodies, sizes[i]);
        bodies += sizes[i];
        uint32_t own = rs_crc32(0, r + 8, length - 8);
        store32(r + 4, own);
        /* the segment's CRC: on over the length and CRC, then combined with the rest's */
        if (op_len != length - 8u) {  /* one operator for a run of equal lengths */
            op_len = length - 8u;
            op = x2nmodp(op_len, 3);
        }
        running = multmodp(op, rs_crc32(running, r, 8)) ^ own;
        pos += length;
        ends[i] = pos;
    }
    *crc = running;
    return pos;
}


size_t rs_scan(const unsigned char *buf, size_t n, uint32_t max_record, uint32_t max_body,
               uint64_t expected, uint64_t min_ts, uint64_t *ends, uint64_t *bodies,
               uint64_t *ts, uint64_t *seqs, size_t maxn, rs_stop *stop) {
    size_t pos = 0, count = 0;
    int same_names = 1;
    memset(stop, 0, sizeof *stop);
    while (pos < n && count < maxn) {
        if (n - pos < RS_OVERHEAD) {
            stop->fault = RS_TRUNCATED;
            break;
        }
        const unsigned char *r = buf + pos;
        uint32_t length = load32(r), crc = load32(r + 4);
        uint32_t flags = r[32], names = (uint32_t)r[33] + r[34];
        stop->length = length;
        stop->offset = load64(r + 8);
        stop->timestamp = load64(r + 16);
        stop->flags = flags;
        if (length < RS_OVERHEAD + names || length > max_record) {
            stop->fault = RS_LENGTH;
            break;
        }
        if (n - pos < length) {
            stop->fault = RS_TRUNCATED;
            break;
        }
        if (rs_crc32(0, r + 8, length - 8) != crc) {
            stop->fault = RS_CHECKSUM;
            break;
        }
        if (flags != 0) {
            stop->fault = RS_FLAGS;
            break;
        }
        stop->body = length - RS_OVERHEAD - names;
        if (stop->offset != expected) {
            stop->fault = RS_OFFSET;
            break;
        }
        if (stop->timestamp < min_ts) {
            stop->fault = RS_TIMESTAMP;
            break;
        }
        if (stop->body > max_body) {
            stop->fault = RS_BODY;
            break;
        }
        if (count && same_names &&
            (r[33] != buf[33] || r[34] != buf[34] ||
             memcmp(r + RS_OVERHEAD, buf + RS_OVERHEAD, names) != 0)) {
            same_names = 0;
        }
        bodies[count] = pos + RS_OVERHEAD + names;
        pos += length;
        ends[count] = pos;
        ts[count] = stop->timestamp;
        seqs[count] = load64(r + 24);
        count++;
        expected++;
        min_ts = stop->timestamp;
    }
    if (stop->fault == RS_OK) memset(stop, 0, sizeof *stop);
    stop->same_names = same_names;
    return count;
}
