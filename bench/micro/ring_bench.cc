// Google Benchmark micro-benchmarks of the ring's hot operations on the
// in-process fake link (core/link/fake_link.h): the ring protocol and its
// copies, without a transport's doorbells. Run by bench/run (section micro).
//   BM_PublishConsume/N  write N bytes (copy + publish the tail), read them
//                        back (copy + publish the head), one thread
//   BM_Wrap/N            the same with every message split across the
//                        ring's end (ring of N bytes, messages of N - 1)
//   BM_Readable          the cursor check a reader spins on (readable())
#include <benchmark/benchmark.h>
#include <sys/uio.h>

#include <vector>

#include "link/fake_link.h"
#include "ring/ring_channel.h"

namespace rdmashim {
namespace {

void round_trip(benchmark::State& state, size_t ring, size_t len) {
  FakeLinkPair pair(ring);
  RingChannel tx(pair.a), rx(pair.b);
  std::vector<unsigned char> out(len, 0x5a), in(len);
  iovec wi{out.data(), len}, ri{in.data(), len};
  for (auto _ : state) {
    if (tx.write(&wi, 1) != static_cast<ssize_t>(len) || rx.read(&ri, 1) != static_cast<ssize_t>(len)) {
      state.SkipWithError("ring write/read short");
      break;
    }
    benchmark::DoNotOptimize(in.data());
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * len));
}

void BM_PublishConsume(benchmark::State& state) {
  round_trip(state, 1 << 20, static_cast<size_t>(state.range(0)));
}
BENCHMARK(BM_PublishConsume)->Arg(1)->Arg(64)->Arg(4096)->Arg(65536);

// Ring N (a power of two, as the protocol needs), messages N - 1: after
// the first, every message wraps.
void BM_Wrap(benchmark::State& state) {
  size_t ring = static_cast<size_t>(state.range(0));
  round_trip(state, ring, ring - 1);
}
BENCHMARK(BM_Wrap)->Arg(64)->Arg(4096)->Arg(65536);

void BM_Readable(benchmark::State& state) {
  FakeLinkPair pair(1 << 20);
  RingChannel rx(pair.b);
  for (auto _ : state) benchmark::DoNotOptimize(rx.readable());
}
BENCHMARK(BM_Readable);

}  // namespace
}  // namespace rdmashim

BENCHMARK_MAIN();
