/* Exercises every function of native/ringbuf.c against a flat model, for valgrind / ASan.
 * Exit status 0 when every result matched the model. */
#define _POSIX_C_SOURCE 200809L
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check.h"
#include "ringbuf.h"

#define MODEL_MAX (1 << 16)
static unsigned char model[MODEL_MAX];
static unsigned char out_buf[MODEL_MAX];
static size_t model_len;
/* A pipe whose ends do not block. */
static int nonblocking_pipe(int fds[2]) {
    if (pipe(fds) != 0) return -1;
    for (int i = 0; i < 2; i++) {
        if (fcntl(fds[i], F_SETFL, fcntl(fds[i], F_GETFL) | O_NONBLOCK) != 0) return -1;
    }
    return 0;
}

static int run(size_t cap, int steps) {
    rb_ring *rb = rb_new(cap);
    CHECK(rb != NULL);
    int in[2], to[2]; /* bytes go in -> ring (rb_recv_fd), ring -> to (rb_send_fd) */
    CHECK(nonblocking_pipe(in) == 0 && nonblocking_pipe(to) == 0);
    model_len = 0;
    char buf[4096], out[4096];
    uint32_t lens[16];
    for (int s = 0; s < steps; s++) {
        size_t n = rnd(300);
        for (size_t i = 0; i < n; i++) buf[i] = (char)rnd(256);
        switch (rnd(12)) {
        case 0: { /* write */
            size_t w = rb_write(rb, buf, n);
            size_t room = cap - model_len;
            CHECK(w == (n < room ? n : room));
            memcpy(model + model_len, buf, w);
            model_len += w;
            break;
        }
        case 1: { /* read */
            size_t r = rb_read(rb, out, n);
            CHECK(r == (n < model_len ? n : model_len));
            CHECK(memcmp(out, model, r) == 0);
            memmove(model, model + r, model_len - r);
            model_len -= r;
            break;
        }
        case 2: { /* peek + skip */
            size_t r = rb_peek(rb, out, n);
            CHECK(r == (n < model_len ? n : model_len));
            CHECK(memcmp(out, model, r) == 0);
            CHECK(rb_skip(rb, r) == r);
            memmove(model, model + r, model_len - r);
            model_len -= r;
            break;
        }
        case 3: { /* regions */
            char *p;
            size_t w = rb_writable_region(rb, &p);
            size_t k = n < w ? n : w;
            memcpy(p, buf, k);
            CHECK(rb_commit(rb, k) == k);
            memcpy(model + model_len, buf, k);
            model_len += k;
            size_t r = rb_readable_region(rb, &p);
            CHECK(r <= model_len);
            CHECK(memcmp(p, model, r) == 0);
            break;
        }
        case 4: { /* one frame */
            uint32_t len = (uint32_t)(n / 3);
            int ok = rb_put_frame(rb, buf, len);
            CHECK(ok == (len + 4 <= cap - model_len));
            if (ok) {
                model[model_len] = (unsigned char)(len >> 24);
                model[model_len + 1] = (unsigned char)(len >> 16);
                model[model_len + 2] = (unsigned char)(len >> 8);
                model[model_len + 3] = (unsigned char)len;
                memcpy(model + model_len + 4, buf, len);
                model_len += 4 + len;
            }
            break;
        }
        case 5: { /* frames */
            size_t count = 1 + rnd(16), total = 0;
            for (size_t i = 0; i < count; i++) {
                lens[i] = rnd(20);
                total += lens[i];
            }
            size_t fit = rb_frames_fit(rb, lens, count, 1 << 20);
            size_t put = rb_put_frames(rb, buf, lens, count);
            CHECK(fit == put);
            const char *src = buf;
            for (size_t i = 0; i < put; i++) {
                uint32_t len = lens[i];
                model[model_len] = 0;
                model[model_len + 1] = 0;
                model[model_len + 2] = (unsigned char)(len >> 8);
                model[model_len + 3] = (unsigned char)len;
                memcpy(model + model_len + 4, src, len);
                model_len += 4 + len;
                src += len;
            }
            (void)total;
            break;
        }
        case 6: { /* take frames */
            size_t used = 0;
            size_t got = rb_take_frames(rb, out, sizeof out, lens, 16, 200, &used);
            size_t off = 0;
            for (size_t i = 0; i < got; i++) {
                uint32_t len = ((uint32_t)model[0] << 24) | ((uint32_t)model[1] << 16) |
                               ((uint32_t)model[2] << 8) | model[3];
                CHECK(len == lens[i]);
                CHECK(memcmp(out + off, model + 4, len) == 0);
                off += len;
                memmove(model, model + 4 + len, model_len - 4 - len);
                model_len -= 4 + len;
            }
            CHECK(off == used);
            break;
        }
        case 7: { /* from a descriptor: what is ready, up to the free space */
            size_t room = cap - model_len;
            size_t k = n < room ? n : room;
            if (k) CHECK(write(in[1], buf, k) == (ssize_t)k);
            ssize_t got = rb_recv_fd(rb, in[0]);
            if (room == 0) {
                CHECK(got == -ENOBUFS);
            } else if (k == 0) {
                CHECK(got == -EAGAIN || got == -EWOULDBLOCK);
            } else {
                CHECK(got == (ssize_t)k);
            }
            if (k) memcpy(model + model_len, buf, k);
            model_len += k;
            break;
        }
        case 8: { /* to a descriptor: every readable byte, both runs */
            ssize_t sent = rb_send_fd(rb, to[1]);
            CHECK(sent == (ssize_t)model_len);
            size_t off = 0;
            while (off < model_len) {
                ssize_t r = read(to[0], out_buf + off, model_len - off);
                CHECK(r > 0);
                off += (size_t)r;
            }
            CHECK(memcmp(out_buf, model, model_len) == 0);
            model_len = 0;
            break;
        }
        case 9: { /* take one frame, if whole and short enough */
            uint32_t maxlen = (uint32_t)n;
            int64_t got = rb_take_frame(rb, out, maxlen);
            uint32_t want = 0;
            if (model_len >= 4)
                want = ((uint32_t)model[0] << 24) | ((uint32_t)model[1] << 16) |
                       ((uint32_t)model[2] << 8) | model[3];
            if (model_len < 4 || model_len - 4 < want || want > maxlen) {
                CHECK(got == -1);
            } else {
                /* RB_TAKE_MORE added exactly when bytes are left after the frame */
                int64_t more = model_len > 4 + (size_t)want ? RB_TAKE_MORE : 0;
                CHECK(got == (int64_t)want + more);
                CHECK(memcmp(out, model + 4, want) == 0);
                memmove(model, model + 4 + want, model_len - 4 - want);
                model_len -= 4 + want;
            }
            break;
        }
        case 10: { /* grow now and then: the bytes and counters stay, the room grows */
            CHECK(rb_grow(rb, cap) == -1 && rb_grow(rb, cap * 3) == -1);
            if (cap < 8192 && rnd(4) == 0) {
                size_t written = rb_total_written(rb), taken = rb_total_read(rb);
                CHECK(rb_grow(rb, cap * 2) == 0);
                cap *= 2;
                CHECK(rb_capacity(rb) == cap && rb_used(rb) == model_len);
                CHECK(rb_total_written(rb) == written && rb_total_read(rb) == taken);
                CHECK(rb_peek(rb, (char *)out_buf, model_len) == model_len);
                CHECK(memcmp(out_buf, model, model_len) == 0);
            }
            break;
        }
        default: { /* status */
            uint32_t len = 0;
            int st = rb_frame_status(rb, &len);
            if (model_len < 4) {
                CHECK(st == RB_FRAME_NONE);
            } else {
                uint32_t want = ((uint32_t)model[0] << 24) | ((uint32_t)model[1] << 16) |
                                ((uint32_t)model[2] << 8) | model[3];
                CHECK(len == want);
                CHECK(st == (model_len - 4 >= want ? RB_FRAME_COMPLETE : RB_FRAME_PARTIAL));
            }
        }
        }
        CHECK(rb_used(rb) == model_len);
        CHECK(rb_free_space(rb) == cap - model_len);
    }
    if (model_len < cap) { /* the end of the stream reads as 0 */
        CHECK(close(in[1]) == 0);
        CHECK(rb_recv_fd(rb, in[0]) == 0);
    } else {
        CHECK(close(in[1]) == 0);
        CHECK(rb_recv_fd(rb, in[0]) == -ENOBUFS);
    }
    CHECK(rb_send_fd(rb, -1) == (model_len ? -EBADF : 0)); /* errors come back as -errno */
    close(in[0]);
    close(to[0]);
    close(to[1]);
    rb_free(rb);
    return 0;
}

int main(void) {
    CHECK(rb_new(0) == NULL);
    CHECK(rb_new(3) == NULL);
    CHECK(rb_new((size_t)RB_MAX_CAPACITY * 2) == NULL);
    rb_free(NULL);
    size_t caps[] = {1, 2, 4, 64, 1024, 65536};
    for (size_t i = 0; i < sizeof caps / sizeof caps[0]; i++) {
        if (run(caps[i], 3000) != 0) return 1;
    }
    puts("ringbuf_check: ok");
    return 0;
}
