/* What the C check programs share: a failed check returns 1 from the function it is in,
 * naming the line, and a seeded xorshift for their random steps (the same every run). */
#ifndef RDVPUMP_CHECK_H
#define RDVPUMP_CHECK_H

#include <stdio.h>

#define CHECK(cond)                                                       \
    do {                                                                  \
        if (!(cond)) {                                                    \
            fprintf(stderr, "%s:%d: check failed: %s\n", __FILE__, __LINE__, #cond); \
            return 1;                                                     \
        }                                                                 \
    } while (0)

static unsigned long long rng_state = 88172645463325252ULL;

/* A number in [0, n). */
static unsigned rnd(unsigned n) {
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (unsigned)(rng_state % n);
}

#endif
