/* rdvpump syncer: see syncer.h for the contract of every function. */
#include "syncer.h"

#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { IDLE, QUEUED, RUNNING, FINISHED };

struct sy_syncer {
    pthread_mutex_t lock;
    pthread_cond_t wake;
    int done_fd;
    int state;
    int stopped;
    size_t n;
    int fds[SY_MAX_FDS];
    int errs[SY_MAX_FDS];
};

static void destroy(sy_syncer *s) {
    pthread_cond_destroy(&s->wake);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

static void *run(void *arg) {
    sy_syncer *s = arg;
    pthread_mutex_lock(&s->lock);
    for (;;) {
        while (!s->stopped && s->state != QUEUED) pthread_cond_wait(&s->wake, &s->lock);
        if (s->stopped) break;
        s->state = RUNNING;
        size_t n = s->n;
        pthread_mutex_unlock(&s->lock);
        /* fds and errs are the thread's while RUNNING: sy_submit and sy_take refuse */
        for (size_t i = 0; i < n; i++) s->errs[i] = fsync(s->fds[i]) == 0 ? 0 : errno;
        pthread_mutex_lock(&s->lock);
        if (s->stopped) break;
        s->state = FINISHED;
        uint64_t one = 1;
        ssize_t w;
        do {
            w = write(s->done_fd, &one, sizeof one);
        } while (w < 0 && errno == EINTR);
        /* an eventfd refuses a write only at 2^64 - 1 unread: it is read once a job */
    }
    pthread_mutex_unlock(&s->lock);
    destroy(s);
    return NULL;
}

sy_syncer *sy_start(int done_fd) {
    sy_syncer *s = calloc(1, sizeof *s);
    if (s == NULL) return NULL;
    s->done_fd = done_fd;
    s->state = IDLE;
    int err = pthread_mutex_init(&s->lock, NULL);
    if (err == 0) {
        err = pthread_cond_init(&s->wake, NULL);
        if (err != 0) pthread_mutex_destroy(&s->lock);
    }
    if (err != 0) {
        free(s);
        errno = err;
        return NULL;
    }
    pthread_attr_t attr;
    pthread_t thread;
    err = pthread_attr_init(&attr);
    if (err == 0) {
        /* the thread takes no signals (it inherits the mask): they stay the pump's */
        sigset_t all, old;
        sigfillset(&all);
        pthread_sigmask(SIG_SETMASK, &all, &old);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        err = pthread_create(&thread, &attr, run, s);
        pthread_sigmask(SIG_SETMASK, &old, NULL);
        pthread_attr_destroy(&attr);
    }
    if (err != 0) {
        destroy(s);
        errno = err;
        return NULL;
    }
    return s;
}

int sy_submit(sy_syncer *s, const int *fds, size_t n) {
    if (n > SY_MAX_FDS) return -E2BIG;
    pthread_mutex_lock(&s->lock);
    if (s->state != IDLE) {
        pthread_mutex_unlock(&s->lock);
        return -EBUSY;
    }
    memcpy(s->fds, fds, n * sizeof *fds);
    s->n = n;
    s->state = QUEUED;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
    return 0;
}

int sy_take(sy_syncer *s, int *errs, size_t n) {
    pthread_mutex_lock(&s->lock);
    if (s->state != FINISHED) {
        pthread_mutex_unlock(&s->lock);
        return -EAGAIN;
    }
    size_t k = n < s->n ? n : s->n;
    memcpy(errs, s->errs, k * sizeof *errs);
    s->state = IDLE;
    pthread_mutex_unlock(&s->lock);
    return (int)k;
}

void sy_stop(sy_syncer *s) {
    pthread_mutex_lock(&s->lock);
    s->stopped = 1;
    pthread_cond_signal(&s->wake);
    pthread_mutex_unlock(&s->lock);
}
