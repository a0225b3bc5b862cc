/* rdvpump ring buffer: a single-producer single-consumer byte ring.
 *
 * This header is the single source of truth for the C API: native/build_ringbuf.py
 * reads the declarations between the CDEF markers and hands them to cffi, so the
 * Python binding and the C code cannot drift.
 *
 * Indices run free (they only ever grow) and are masked on access, so a ring of
 * capacity C holds C bytes, not C - 1.  One thread (or pump task) writes, one
 * reads; head and tail are published with release stores and read with acquire
 * loads, so producer and consumer may also live on two threads.
 *
 * Frames are a 4-byte big-endian unsigned length followed by the body.
 */
#ifndef RDVPUMP_RINGBUF_H
#define RDVPUMP_RINGBUF_H

#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

/* CDEF-BEGIN */
#define RB_MIN_CAPACITY 1
#define RB_MAX_CAPACITY 1073741824
#define RB_HEADER_SIZE 4
#define RB_FRAME_NONE 0
#define RB_FRAME_PARTIAL 1
#define RB_FRAME_COMPLETE 2
#define RB_TAKE_MORE 4294967296

typedef struct rb_ring rb_ring;

/* Create a ring; capacity must be a power of two within the limits, else NULL. */
rb_ring *rb_new(size_t capacity);
void rb_free(rb_ring *rb);

size_t rb_capacity(const rb_ring *rb);
/* Grow the ring to `capacity` (a power of two above the current one, within the
 * limits), keeping the bytes it holds and its counters: 0, or -1 (a bad capacity, or
 * no memory: the ring is as it was).  Only while no region of it is in use (the one
 * thread that reads it and writes it, between calls). */
int rb_grow(rb_ring *rb, size_t capacity);
/* Where the ring's bytes start (a run round the end goes on there). */
char *rb_base(const rb_ring *rb);
size_t rb_used(const rb_ring *rb);
size_t rb_free_space(const rb_ring *rb);
/* Bytes ever written to / read from the ring (a link's byte counters). */
size_t rb_total_written(const rb_ring *rb);
size_t rb_total_read(const rb_ring *rb);

/* Byte stream: copy in / out as much as fits; return the count moved. */
size_t rb_write(rb_ring *rb, const char *data, size_t n);
size_t rb_read(rb_ring *rb, char *out, size_t n);
/* Copy up to n readable bytes out without consuming them. */
size_t rb_peek(const rb_ring *rb, char *out, size_t n);
/* Drop up to n readable bytes; return the count dropped. */
size_t rb_skip(rb_ring *rb, size_t n);

/* Zero-copy regions: the first contiguous readable / writable run.
 * Set *ptr and return its length (0 when none).  After using the region,
 * rb_skip() consumes what was read and rb_commit() publishes what was written. */
size_t rb_readable_region(const rb_ring *rb, char **ptr);
size_t rb_writable_region(const rb_ring *rb, char **ptr);
size_t rb_commit(rb_ring *rb, size_t n);

/* A descriptor (a non-blocking socket): one call over both runs, no copy.
 * rb_recv_fd reads (readv) into the free space and publishes what came: the count
 * (> 0), 0 at end of stream, -EAGAIN (or -EWOULDBLOCK) when nothing is ready, -ENOBUFS
 * when the ring is full (nothing is read), else -errno.  rb_send_fd writes the
 * readable bytes (sendmsg with MSG_NOSIGNAL; writev when fd is not a socket) and drops
 * what left: the count (0 when the ring is empty), -EAGAIN when the descriptor takes
 * nothing now, else -errno (-EPIPE, not SIGPIPE, when a socket's peer is gone).  Both
 * retry on EINTR. */
ssize_t rb_recv_fd(rb_ring *rb, int fd);
ssize_t rb_send_fd(rb_ring *rb, int fd);

/* One frame straight to a descriptor, past any ring: its 4-byte header (the length n)
 * and its body given as `count` pieces (at most RB_SEND_PIECES, lengths adding up to
 * n), in one sendmsg (MSG_NOSIGNAL; writev when fd is not a socket).  Returns the bytes
 * that left (the header's included; the rest of the frame is the caller's to send),
 * -EAGAIN when the descriptor takes nothing now, -E2BIG past RB_SEND_PIECES pieces, else
 * -errno.  Retries on EINTR. */
#define RB_SEND_PIECES 16
ssize_t rb_send_frame(int fd, uint32_t n, char *pieces[], size_t lens[], size_t count);

/* Frames.  Put one frame whole or not at all: 1 if put, 0 if it does not fit. */
int rb_put_frame(rb_ring *rb, const char *body, uint32_t n);
/* Put frames whose bodies lie back to back in `bodies` with lengths `lens`,
 * in order, each whole, stopping at the first that does not fit.
 * Return how many were put. */
size_t rb_put_frames(rb_ring *rb, const char *bodies, const uint32_t *lens, size_t count);
/* How many of the frames with body lengths `lens` fit, in order, each whole, in the
 * free space now, with at most max_bytes of bodies in all (at least one frame is
 * counted if it fits, whatever its size). */
size_t rb_frames_fit(const rb_ring *rb, const uint32_t *lens, size_t count, size_t max_bytes);
/* Inspect the next frame: RB_FRAME_NONE if fewer than 4 bytes are readable,
 * RB_FRAME_PARTIAL if the header is there but not the whole body,
 * RB_FRAME_COMPLETE if the whole frame is there.  *len gets the body length
 * whenever the header is readable. */
int rb_frame_status(const rb_ring *rb, uint32_t *len);
/* Take complete frames in order: bodies go back to back into out (outcap bytes),
 * lengths into lens (at most maxn).  Stops at the first frame that is not
 * complete, whose body is longer than maxlen, or that does not fit in what is
 * left of out.  *out_used gets the body bytes written.  Return the frame count. */
size_t rb_take_frames(rb_ring *rb, char *out, size_t outcap, uint32_t *lens, size_t maxn,
                      uint32_t maxlen, size_t *out_used);
/* Take the next frame if it is complete and its body at most maxlen bytes long: the
 * body goes to out (maxlen bytes at least).  Return its length, plus RB_TAKE_MORE
 * when bytes are left in the ring after it (one call tells a lone frame from
 * the first of several); -1 when nothing was taken. */
int64_t rb_take_frame(rb_ring *rb, char *out, uint32_t maxlen);
/* Whether the n (at least 1) lengths are all the same: 1 if so, else 0 (frames taken
 * are then cut by one unpack, with no list of their lengths made first). */
int rb_lens_uniform(const uint32_t *lens, size_t n);
/* Have the C library keep up to `keep` bytes that free() returns at the top of its heap,
 * and serve every block below `map_above` bytes from that heap: a frame of some hundred
 * KiB copied out of a ring then reuses pages already mapped, where glibc's defaults
 * hand them back to the kernel and take them again, a page fault every 4 KiB (glibc's
 * M_TRIM_THRESHOLD and M_MMAP_THRESHOLD).  1 when set; 0 where the C library has no
 * such setting or refused the values. */
int rb_keep_freed(size_t keep, size_t map_above);
/* CDEF-END */

#endif
