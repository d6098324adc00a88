// iovec arithmetic for the data paths.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace rdmashim {

inline size_t iov_total(const iovec* iov, int n) {
  size_t t = 0;
  for (int i = 0; i < n; ++i) t += iov[i].iov_len;
  return t;
}

// Writes into `out` (at most `cap` entries) the bytes of iov that follow the
// first `skip` bytes, at most `max` of them. Returns the entry count.
inline int iov_slice(const iovec* iov, int n, size_t skip, size_t max, iovec* out, int cap) {
  int k = 0;
  for (int i = 0; i < n && k < cap && max > 0; ++i) {
    size_t len = iov[i].iov_len;
    if (skip >= len) {
      skip -= len;
      continue;
    }
    size_t take = len - skip;
    if (take > max) take = max;
    out[k].iov_base = static_cast<char*>(iov[i].iov_base) + skip;
    out[k].iov_len = take;
    ++k;
    max -= take;
    skip = 0;
  }
  return k;
}

}  // namespace rdmashim
