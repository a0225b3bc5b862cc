/* rdvpump syncer: fsyncs run in a thread that never takes Python's GIL.
 *
 * An MQ server's group commit runs its fsyncs beside the pump.  A Python thread doing
 * them first waits for the GIL to wake up, and the pump holds it while it works: under
 * load the fsync started up to a millisecond late, often longer than the fsync took.
 * This thread is C's own: the pump hands it descriptors, it fsyncs them in order and
 * says it is done by writing 1 to an eventfd the pump waits on (and by the state
 * sy_take reads, which the pump also asks at each write: mq/topics/_syncers.py).
 *
 * One job at a time.  As with native/ringbuf.h, native/build_ringbuf.py hands the
 * declarations between the CDEF markers to cffi.
 */
#ifndef RDVPUMP_SYNCER_H
#define RDVPUMP_SYNCER_H

#include <stddef.h>

/* CDEF-BEGIN */
/* Descriptors one job fsyncs at most. */
#define SY_MAX_FDS 256

typedef struct sy_syncer sy_syncer;

/* A syncer whose thread writes 1 (8 bytes, as eventfd wants) to `done_fd` after each
 * job; NULL if the thread could not start (errno says why). */
sy_syncer *sy_start(int done_fd);
/* fsync fds[0..n) in the syncer's thread, in order.  0; -EBUSY while a job is under
 * way (nothing done); -E2BIG if n > SY_MAX_FDS. */
int sy_submit(sy_syncer *s, const int *fds, size_t n);
/* The finished job's result: errs[i] gets fds[i]'s fsync errno (0: done), and the job
 * is over (another may be submitted).  n, or -EAGAIN if the job is not finished. */
int sy_take(sy_syncer *s, int *errs, size_t n);
/* No more jobs: the thread ends after the one under way, without writing to
 * `done_fd`, and frees the syncer (never used again here); not waited for. */
void sy_stop(sy_syncer *s);
/* CDEF-END */

#endif
