// Small helpers shared across the core: time, randomness, branch hints.
#pragma once

#include <sys/random.h>
#include <time.h>

#include <cstddef>
#include <cstdint>

#define RDMASHIM_LIKELY(x) __builtin_expect(!!(x), 1)
#define RDMASHIM_UNLIKELY(x) __builtin_expect(!!(x), 0)

namespace rdmashim {

inline uint64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// The same clock at the kernel's tick (1-4 ms), never a system call: the
// vDSO answers it from its data page even where the clocksource cannot be
// read in user space (hpet, acpi_pm: some VMs, qemu without KVM), where
// now_ns() costs a system call and a device read. Not comparable with
// now_ns() values (it lags by up to a tick).
inline uint64_t coarse_now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC_COARSE, &ts);
  return static_cast<uint64_t>(ts.tv_sec) * 1000000000ull + static_cast<uint64_t>(ts.tv_nsec);
}

// Fills buf with kernel randomness; false if the kernel could not provide it
// (callers then fall back to TCP rather than use weak nonces).
inline bool random_bytes(void* buf, size_t len) {
  auto* p = static_cast<unsigned char*>(buf);
  while (len > 0) {
    ssize_t n = getrandom(p, len, GRND_NONBLOCK);
    if (n <= 0) return false;
    p += n;
    len -= static_cast<size_t>(n);
  }
  return true;
}

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace rdmashim
