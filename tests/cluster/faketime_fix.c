/* Preloaded before Debian's libfaketime 0.9.10 in the clock tests (tests/cluster/faketime.py).
 *
 * With FAKETIME_DONT_FAKE_MONOTONIC=1 (so durations stay true), libfaketime 0.9.10 still
 * rewrites absolute CLOCK_MONOTONIC deadlines as if they were faked times and hands the kernel
 * a negative time (libfaketime issue #426, fixed upstream after 0.9.10). A monotonic clock that
 * is not faked needs no rewriting, so this shim sends such waits past libfaketime:
 *
 * - clock_nanosleep() on CLOCK_MONOTONIC: Python 3.11's time.sleep() sleeps that way and
 *   failed with EINVAL.
 * - pthread_cond_timedwait() on a condition variable whose clock is CLOCK_MONOTONIC: CPython
 *   waits for the GIL that way (5 ms ahead); every wait timed out at once, so a thread wanting
 *   the GIL spun, took it from the running thread within microseconds and read the offset
 *   file on each try. A process with two busy Python threads ran ~30x slower, and the ranks of
 *   a node under libfaketime burnt extra CPU and were named stragglers. Such waits go to
 *   pthread_cond_clockwait(), which 0.9.10 does not interpose. glibc keeps a condition
 *   variable's clock in bit 1 of __data.__wrefs; the constructor checks that on this glibc
 *   and, if it does not hold, leaves every wait to libfaketime as before.
 *
 * Waits on CLOCK_REALTIME still go through libfaketime.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

int clock_nanosleep(clockid_t clock_id, int flags, const struct timespec *req, struct timespec *rem) {
  static int (*next)(clockid_t, int, const struct timespec *, struct timespec *);
  if (clock_id == CLOCK_MONOTONIC || clock_id == CLOCK_BOOTTIME) {
    return syscall(SYS_clock_nanosleep, clock_id, flags, req, rem) == 0 ? 0 : errno;
  }
  if (next == NULL) {
    next = (int (*)(clockid_t, int, const struct timespec *, struct timespec *))dlsym(RTLD_NEXT, "clock_nanosleep");
  }
  return next(clock_id, flags, req, rem);
}

/* pthread_cond_clockwait() is glibc 2.30's: on an older glibc the shim leaves condition waits
 * to libfaketime, as before. */
#if defined(__GLIBC_PREREQ)
#if __GLIBC_PREREQ(2, 30)
#define HAVE_COND_CLOCKWAIT 1
#endif
#endif

#ifdef HAVE_COND_CLOCKWAIT
/* glibc's mark of a CLOCK_MONOTONIC condition variable in __data.__wrefs. */
#define COND_MONOTONIC 2u

/* 1 once the constructor has seen glibc mark a monotonic condition variable (and only it). */
static int cond_clock_known;

static int is_monotonic(const pthread_cond_t *cond) { return (cond->__data.__wrefs & COND_MONOTONIC) != 0; }

/* glibc's own pthread_cond_init (not libfaketime's, which may not be set up yet). */
static int libc_cond_init(pthread_cond_t *cond, const pthread_condattr_t *attr) {
  void *libc = dlopen("libc.so.6", RTLD_LAZY | RTLD_NOLOAD);
  int (*init)(pthread_cond_t *, const pthread_condattr_t *) = NULL;
  if (libc != NULL) {
    init = (int (*)(pthread_cond_t *, const pthread_condattr_t *))dlvsym(libc, "pthread_cond_init", "GLIBC_2.3.2");
    dlclose(libc);
  }
  return init != NULL ? init(cond, attr) : -1;
}

__attribute__((constructor)) static void check_cond_clock(void) {
  pthread_condattr_t attr;
  pthread_cond_t mono, real = PTHREAD_COND_INITIALIZER;
  if (pthread_condattr_init(&attr) != 0) return;
  if (pthread_condattr_setclock(&attr, CLOCK_MONOTONIC) == 0 && libc_cond_init(&mono, &attr) == 0) {
    cond_clock_known = is_monotonic(&mono) && !is_monotonic(&real);
  }
  pthread_condattr_destroy(&attr);
}

int pthread_cond_timedwait(pthread_cond_t *restrict cond, pthread_mutex_t *restrict mutex,
                           const struct timespec *restrict abstime) {
  static int (*next)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *);
  if (cond_clock_known && is_monotonic(cond)) {
    return pthread_cond_clockwait(cond, mutex, CLOCK_MONOTONIC, abstime);
  }
  if (next == NULL) {
    next = (int (*)(pthread_cond_t *, pthread_mutex_t *, const struct timespec *))dlvsym(
        RTLD_NEXT, "pthread_cond_timedwait", "GLIBC_2.3.2");
  }
  return next(cond, mutex, abstime);
}
#endif
