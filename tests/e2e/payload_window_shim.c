/* Fault injection for tests/e2e/test_inprocess_reload.py (preloaded into its child process only).

   Triton's backend thread releases a load's caller from inside Payload::Execute (it fulfils the
   payload's promise: a futex wake through libc's syscall()) and only afterwards puts its model
   instance back in its queue; an unload in between crashes the model deleter
   (pytriton/inprocess/_settle.py). On a loaded machine the thread is sometimes preempted right
   there. This wrapper of syscall() makes that certain: after a FUTEX_WAKE called from the bytes of
   Payload::Execute (PYTRITON_TEST_EXECUTE_RANGE, "start:end" in hex, offsets in libtritonserver,
   read from its symbol table by the test), the thread keeps running for PYTRITON_TEST_SPIN_MS
   milliseconds, as a preempted thread would stay off its queue (running, not asleep). Every other
   call passes through unchanged. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdarg.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>

static long (*real_syscall)(long, ...);
static uintptr_t start, end;
static long spin_ms = -1;

static void configure(void) {
  const char* range = getenv("PYTRITON_TEST_EXECUTE_RANGE");
  const char* spin = getenv("PYTRITON_TEST_SPIN_MS");
  if (range) {
    char* colon;
    start = strtoull(range, &colon, 16);
    end = (*colon == ':') ? strtoull(colon + 1, NULL, 16) : 0;
  }
  spin_ms = spin ? atol(spin) : 0;
}

long syscall(long number, ...) {
  va_list ap;
  va_start(ap, number);
  long a1 = va_arg(ap, long), a2 = va_arg(ap, long), a3 = va_arg(ap, long);
  long a4 = va_arg(ap, long), a5 = va_arg(ap, long), a6 = va_arg(ap, long);
  va_end(ap);
  if (!real_syscall) real_syscall = (long (*)(long, ...))dlsym(RTLD_NEXT, "syscall");
  long result = real_syscall(number, a1, a2, a3, a4, a5, a6);
  if (number == SYS_futex && (a2 & 0x7f) == 1 /* FUTEX_WAKE */) {
    if (spin_ms < 0) configure();
    Dl_info info;
    uintptr_t caller = (uintptr_t)__builtin_return_address(0);
    if (spin_ms > 0 && end > start && dladdr((void*)caller, &info) && info.dli_fname &&
        strstr(info.dli_fname, "libtritonserver")) {
      uintptr_t offset = caller - (uintptr_t)info.dli_fbase;
      if (offset >= start && offset < end) {
        struct timespec now, until;
        clock_gettime(CLOCK_MONOTONIC, &until);
        until.tv_sec += spin_ms / 1000;
        until.tv_nsec += (spin_ms % 1000) * 1000000L;
        if (until.tv_nsec >= 1000000000L) { until.tv_sec++; until.tv_nsec -= 1000000000L; }
        do clock_gettime(CLOCK_MONOTONIC, &now);
        while (now.tv_sec < until.tv_sec || (now.tv_sec == until.tv_sec && now.tv_nsec < until.tv_nsec));
      }
    }
  }
  return result;
}
