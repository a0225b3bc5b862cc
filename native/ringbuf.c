/* rdvpump ring buffer: a single-producer single-consumer byte ring with frame helpers.
 * See ringbuf.h for the contract of every function. */
#define _POSIX_C_SOURCE 200809L
#include "ringbuf.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif

struct rb_ring {
    size_t capacity;
    size_t mask;
    size_t head; /* total bytes ever written; owned by the producer */
    size_t tail; /* total bytes ever read; owned by the consumer */
    char *data;
};

/* The producer publishes head, the consumer publishes tail.  Release stores
 * pair with acquire loads so the bytes are visible before the index moves. */
#define LOAD_ACQ(p) __atomic_load_n((p), __ATOMIC_ACQUIRE)
#define STORE_REL(p, v) __atomic_store_n((p), (v), __ATOMIC_RELEASE)
#define LOAD_OWN(p) __atomic_load_n((p), __ATOMIC_RELAXED)

rb_ring *rb_new(size_t capacity) {
    if (capacity < RB_MIN_CAPACITY || capacity > RB_MAX_CAPACITY) return NULL;
    if ((capacity & (capacity - 1)) != 0) return NULL;
    rb_ring *rb = malloc(sizeof *rb);
    if (rb == NULL) return NULL;
    rb->data = malloc(capacity);
    if (rb->data == NULL) {
        free(rb);
        return NULL;
    }
    rb->capacity = capacity;
    rb->mask = capacity - 1;
    rb->head = 0;
    rb->tail = 0;
    return rb;
}

void rb_free(rb_ring *rb) {
    if (rb == NULL) return;
    free(rb->data);
    free(rb);
}

size_t rb_capacity(const rb_ring *rb) { return rb->capacity; }

char *rb_base(const rb_ring *rb) { return rb->data; }

size_t rb_used(const rb_ring *rb) { return LOAD_ACQ(&rb->head) - LOAD_ACQ(&rb->tail); }
size_t rb_total_written(const rb_ring *rb) { return LOAD_ACQ(&rb->head); }
size_t rb_total_read(const rb_ring *rb) { return LOAD_ACQ(&rb->tail); }

size_t rb_free_space(const rb_ring *rb) { return rb->capacity - rb_used(rb); }

/* Copy n bytes into the ring at absolute index pos (wrapping); no index update. */
static void copy_in(rb_ring *rb, size_t pos, const char *src, size_t n) {
    size_t off = pos & rb->mask;
    size_t first = rb->capacity - off;
    if (first >= n) {
        memcpy(rb->data + off, src, n);
    } else {
        memcpy(rb->data + off, src, first);
        memcpy(rb->data, src + first, n - first);
    }
}

/* Copy n bytes out of the ring from absolute index pos (wrapping). */
static void copy_out(const rb_ring *rb, size_t pos, char *dst, size_t n) {
    size_t off = pos & rb->mask;
    size_t first = rb->capacity - off;
    if (first >= n) {
        memcpy(dst, rb->data + off, n);
    } else {
        memcpy(dst, rb->data + off, first);
        memcpy(dst + first, rb->data, n - first);
    }
}

size_t rb_write(rb_ring *rb, const char *data, size_t n) {
    size_t head = LOAD_OWN(&rb->head);
    size_t room = rb->capacity - (head - LOAD_ACQ(&rb->tail));
    if (n > room) n = room;
    if (n == 0) return 0;
    copy_in(rb, head, data, n);
    STORE_REL(&rb->head, head + n);
    return n;
}

size_t rb_peek(const rb_ring *rb, char *out, size_t n) {
    size_t tail = LOAD_OWN(&rb->tail);
    size_t avail = LOAD_ACQ(&rb->head) - tail;
    if (n > avail) n = avail;
    if (n) copy_out(rb, tail, out, n);
    return n;
}

size_t rb_read(rb_ring *rb, char *out, size_t n) {
    n = rb_peek(rb, out, n);
    if (n) STORE_REL(&rb->tail, LOAD_OWN(&rb->tail) + n);
    return n;
}

size_t rb_skip(rb_ring *rb, size_t n) {
    size_t tail = LOAD_OWN(&rb->tail);
    size_t avail = LOAD_ACQ(&rb->head) - tail;
    if (n > avail) n = avail;
    if (n) STORE_REL(&rb->tail, tail + n);
    return n;
}

size_t rb_readable_region(const rb_ring *rb, char **ptr) {
    size_t tail = LOAD_OWN(&rb->tail);
    size_t avail = LOAD_ACQ(&rb->head) - tail;
    size_t off = tail & rb->mask;
    size_t first = rb->capacity - off;
    *ptr = rb->data + off;
    return avail < first ? avail : first;
}

size_t rb_writable_region(const rb_ring *rb, char **ptr) {
    size_t head = LOAD_OWN(&rb->head);
    size_t room = rb->capacity - (head - LOAD_ACQ(&rb->tail));
    size_t off = head & rb->mask;
    size_t first = rb->capacity - off;
    *ptr = rb->data + off;
    return room < first ? room : first;
}

size_t rb_commit(rb_ring *rb, size_t n) {
    size_t head = LOAD_OWN(&rb->head);
    size_t room = rb->capacity - (head - LOAD_ACQ(&rb->tail));
    if (n > room) n = room;
    if (n) STORE_REL(&rb->head, head + n);
    return n;
}

/* The runs of n bytes from absolute index pos: one or two iovecs (wrapping). */
static int runs(const rb_ring *rb, size_t pos, size_t n, struct iovec iov[2]) {
    size_t off = pos & rb->mask;
    size_t first = rb->capacity - off;
    iov[0].iov_base = rb->data + off;
    if (first >= n) {
        iov[0].iov_len = n;
        return 1;
    }
    iov[0].iov_len = first;
    iov[1].iov_base = rb->data;
    iov[1].iov_len = n - first;
    return 2;
}

ssize_t rb_recv_fd(rb_ring *rb, int fd) {
    size_t head = LOAD_OWN(&rb->head);
    size_t room = rb->capacity - (head - LOAD_ACQ(&rb->tail));
    if (room == 0) return -ENOBUFS;
    struct iovec iov[2];
    int count = runs(rb, head, room, iov);
    ssize_t n;
    do {
        n = readv(fd, iov, count);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    if (n) STORE_REL(&rb->head, head + (size_t)n);
    return n;
}

ssize_t rb_send_fd(rb_ring *rb, int fd) {
    size_t tail = LOAD_OWN(&rb->tail);
    size_t avail = LOAD_ACQ(&rb->head) - tail;
    if (avail == 0) return 0;
    struct iovec iov[2];
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = (size_t)runs(rb, tail, avail, iov);
    ssize_t n;
    do { /* a socket: no SIGPIPE when the peer is gone (EPIPE instead); else writev */
        n = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (n < 0 && errno == ENOTSOCK) n = writev(fd, iov, (int)msg.msg_iovlen);
    } while (n < 0 && errno == EINTR);
    if (n < 0) return -errno;
    if (n) STORE_REL(&rb->tail, tail + (size_t)n);
    return n;
}

ssize_t rb_send_frame(int fd, uint32_t n, char *pieces[], size_t lens[], size_t count) {
    if (count > RB_SEND_PIECES) return -E2BIG;
    unsigned char hdr[RB_HEADER_SIZE] = {(unsigned char)(n >> 24), (unsigned char)(n >> 16),
                                         (unsigned char)(n >> 8), (unsigned char)n};
    struct iovec iov[RB_SEND_PIECES + 1];
    iov[0].iov_base = hdr;
    iov[0].iov_len = RB_HEADER_SIZE;
    for (size_t i = 0; i < count; i++) {
        iov[i + 1].iov_base = pieces[i];
        iov[i + 1].iov_len = lens[i];
    }
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = iov;
    msg.msg_iovlen = count + 1;
    ssize_t sent;
    do { /* as rb_send_fd: no SIGPIPE when a socket's peer is gone */
        sent = sendmsg(fd, &msg, MSG_NOSIGNAL);
        if (sent < 0 && errno == ENOTSOCK) sent = writev(fd, iov, (int)msg.msg_iovlen);
    } while (sent < 0 && errno == EINTR);
    return sent < 0 ? -errno : sent;
}

static void put_header(rb_ring *rb, size_t pos, uint32_t n) {
    char hdr[RB_HEADER_SIZE];
    hdr[0] = (char)(n >> 24);
    hdr[1] = (char)(n >> 16);
    hdr[2] = (char)(n >> 8);
    hdr[3] = (char)n;
    copy_in(rb, pos, hdr, RB_HEADER_SIZE);
}

static uint32_t get_header(const rb_ring *rb, size_t pos) {
    unsigned char hdr[RB_HEADER_SIZE];
    copy_out(rb, pos, (char *)hdr, RB_HEADER_SIZE);
    return ((uint32_t)hdr[0] << 24) | ((uint32_t)hdr[1] << 16) | ((uint32_t)hdr[2] << 8) |
           (uint32_t)hdr[3];
}

int rb_put_frame(rb_ring *rb, const char *body, uint32_t n) {
    size_t head = LOAD_OWN(&rb->head);
    size_t room = rb->capacity - (head - LOAD_ACQ(&rb->tail));
    if ((size_t)n + RB_HEADER_SIZE > room) return 0;
    put_header(rb, head, n);
    if (n) copy_in(rb, head + RB_HEADER_SIZE, body, n);
    STORE_REL(&rb->head, head + RB_HEADER_SIZE + n);
    return 1;
}

size_t rb_put_frames(rb_ring *rb, const char *bodies, const uint32_t *lens, size_t count) {
    size_t head = LOAD_OWN(&rb->head);
    size_t room = rb->capacity - (head - LOAD_ACQ(&rb->tail));
    size_t i;
    for (i = 0; i < count; i++) {
        size_t need = (size_t)lens[i] + RB_HEADER_SIZE;
        if (need > room) break;
        put_header(rb, head, lens[i]);
        if (lens[i]) copy_in(rb, head + RB_HEADER_SIZE, bodies, lens[i]);
        bodies += lens[i];
        head += need;
        room -= need;
    }
    if (i) STORE_REL(&rb->head, head);
    return i;
}

size_t rb_frames_fit(const rb_ring *rb, const uint32_t *lens, size_t count, size_t max_bytes) {
    size_t room = rb_free_space(rb);
    size_t bytes = 0;
    size_t i;
    for (i = 0; i < count; i++) {
        size_t need = (size_t)lens[i] + RB_HEADER_SIZE;
        if (need > room || (i > 0 && bytes + lens[i] > max_bytes)) break;
        room -= need;
        bytes += lens[i];
    }
    return i;
}

int rb_frame_status(const rb_ring *rb, uint32_t *len) {
    size_t tail = LOAD_OWN(&rb->tail);
    size_t avail = LOAD_ACQ(&rb->head) - tail;
    if (avail < RB_HEADER_SIZE) return RB_FRAME_NONE;
    uint32_t n = get_header(rb, tail);
    *len = n;
    return avail - RB_HEADER_SIZE >= (size_t)n ? RB_FRAME_COMPLETE : RB_FRAME_PARTIAL;
}

int64_t rb_take_frame(rb_ring *rb, char *out, uint32_t maxlen) {
    size_t tail = LOAD_OWN(&rb->tail);
    size_t avail = LOAD_ACQ(&rb->head) - tail;
    if (avail < RB_HEADER_SIZE) return -1;
    uint32_t n = get_header(rb, tail);
    if (n > maxlen || avail - RB_HEADER_SIZE < (size_t)n) return -1;
    if (n) copy_out(rb, tail + RB_HEADER_SIZE, out, n);
    STORE_REL(&rb->tail, tail + RB_HEADER_SIZE + n);
    /* what was readable when the call began: a writer's later bytes wait for the next */
    return avail > RB_HEADER_SIZE + (size_t)n ? (int64_t)n + RB_TAKE_MORE : (int64_t)n;
}

size_t rb_take_frames(rb_ring *rb, char *out, size_t outcap, uint32_t *lens, size_t maxn,
                      uint32_t maxlen, size_t *out_used) {
    size_t tail = LOAD_OWN(&rb->tail);
    size_t avail = LOAD_ACQ(&rb->head) - tail;
    size_t used = 0;
    size_t i;
    for (i = 0; i < maxn; i++) {
        if (avail < RB_HEADER_SIZE) break;
        uint32_t n = get_header(rb, tail);
        if (n > maxlen || avail - RB_HEADER_SIZE < (size_t)n || outcap - used < (size_t)n) break;
        if (n) copy_out(rb, tail + RB_HEADER_SIZE, out + used, n);
        lens[i] = n;
        used += n;
        tail += (size_t)n + RB_HEADER_SIZE;
        avail -= (size_t)n + RB_HEADER_SIZE;
    }
    if (i) STORE_REL(&rb->tail, tail);
    *out_used = used;
    return i;
}

int rb_lens_uniform(const uint32_t *lens, size_t n) {
    for (size_t i = 1; i < n; i++)
        if (lens[i] != lens[0]) return 0;
    return 1;
}

int rb_grow(rb_ring *rb, size_t capacity) {
    if (capacity <= rb->capacity || capacity > RB_MAX_CAPACITY) return -1;
    if ((capacity & (capacity - 1)) != 0) return -1;
    char *data = malloc(capacity);
    if (data == NULL) return -1;
    size_t tail = LOAD_OWN(&rb->tail);
    size_t used = LOAD_OWN(&rb->head) - tail;
    rb_ring grown = {capacity, capacity - 1, 0, 0, data};
    char *old = rb->data;
    /* the bytes go where the counters point in the larger ring (they may wrap there) */
    size_t off = tail & rb->mask;
    size_t first = rb->capacity - off;
    if (first >= used) {
        copy_in(&grown, tail, old + off, used);
    } else {
        copy_in(&grown, tail, old + off, first);
        copy_in(&grown, tail + first, old, used - first);
    }
    rb->data = data;
    rb->capacity = capacity;
    rb->mask = capacity - 1;
    free(old);
    return 0;
}

int rb_keep_freed(size_t keep, size_t map_above) {
#ifdef __GLIBC__
    if (keep > INT32_MAX || map_above > INT32_MAX) return 0;
    return mallopt(M_TRIM_THRESHOLD, (int)keep) == 1 && mallopt(M_MMAP_THRESHOLD, (int)map_above) == 1;
#else
    (void)keep;
    (void)map_above;
    return 0;
#endif
}
