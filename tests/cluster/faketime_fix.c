/* Preloaded before Debian's libfaketime 0.9.10 in the clock tests (tests/cluster/faketime.py).
 *
 * With FAKETIME_DONT_FAKE_MONOTONIC=1 (so durations stay true), libfaketime 0.9.10 still
 * rewrites an absolute CLOCK_MONOTONIC deadline of clock_nanosleep() as if it were a faked
 * time, passes a negative time to the kernel, and Python 3.11's time.sleep() (which sleeps
 * that way) fails with EINVAL (libfaketime issue #426, fixed upstream after 0.9.10). A
 * monotonic clock that is not faked needs no rewriting: such sleeps go straight to the kernel;
 * CLOCK_REALTIME sleeps still go through libfaketime.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
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
