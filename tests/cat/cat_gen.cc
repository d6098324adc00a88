// cat_gen BYTES [SEED]: writes BYTES deterministic pseudo-random bytes
// (splitmix64) to stdout, at several GB/s, so the rdma_send/rdma_recv tests
// can move gigabytes without storing them: the same BYTES and SEED always
// give the same stream, and sha256sum tells whether it arrived intact.
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

bool parse(const char* t, uint64_t* out) {
  char* end = nullptr;
  errno = 0;
  unsigned long long v = strtoull(t, &end, 10);
  if (errno || end == t) return false;
  uint64_t mul = 1;
  if (*end == 'k' || *end == 'K') mul = 1ull << 10, ++end;
  else if (*end == 'm' || *end == 'M') mul = 1ull << 20, ++end;
  else if (*end == 'g' || *end == 'G') mul = 1ull << 30, ++end;
  if (*end) return false;
  *out = v * mul;
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  uint64_t bytes = 0, seed = 1;
  if (argc < 2 || argc > 3 || !parse(argv[1], &bytes) || (argc == 3 && !parse(argv[2], &seed))) {
    fprintf(stderr, "usage: cat_gen BYTES[k|m|g] [SEED]\n");
    return 2;
  }
  constexpr size_t kBlock = 1 << 20;
  std::vector<uint64_t> buf(kBlock / 8);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull;
  while (bytes > 0) {
    for (auto& w : buf) {
      uint64_t z = (x += 0x9E3779B97F4A7C15ull);
      z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
      z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
      w = z ^ (z >> 31);
    }
    size_t n = bytes < kBlock ? static_cast<size_t>(bytes) : kBlock;
    const char* p = reinterpret_cast<const char*>(buf.data());
    size_t left = n;
    while (left > 0) {
      ssize_t w = write(1, p, left);
      if (w < 0 && errno == EINTR) continue;
      if (w <= 0) return 1;  // downstream closed: the tests sometimes mean that
      p += w;
      left -= static_cast<size_t>(w);
    }
    bytes -= n;
  }
  return 0;
}
