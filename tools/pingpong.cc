#include "pingpong.h"

#include <time.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <utility>
#include <vector>

#include "util/config.h"
#include "util/misc.h"
#include "json.h"

namespace rdmashim::tools {
namespace {

void usage(const char* tool, bool with_transport) {
  fprintf(stderr,
          "usage: %s --local [options]            both ends on this host (forks a server)\n"
          "       %s server [--port P] [options]  serve clients one after another\n"
          "       %s client HOST[:PORT] [options]\n"
          "options: --size BYTES (64) --iters N (100000) --warmup N --ms T (stop after T ms) --port P --json%s\n"
          "         --stream [--bytes N (1g)] [--idle-ms MS] [--rate B]: one-way size-byte writes, bytes/s\n"
          "           (--rate: paced to B bytes/s)\n",
          tool, tool, tool,
          with_transport ? "\n         --transport auto|shm|verbs|tcp"
                         : "\n         --wait block|poll|epoll (poll/epoll: non-blocking socket, wait for readiness)"
                           "\n         --connects N (with --local: N times connect, one exchange, close)"
                           "\n           [--then N [--gap-ms MS] [--busy K]]: then, MS later, K connections (default 1)"
                           "\n           at once, a thread each, of N round trips each"
                           "\n         --hold N (with --local: N connections open at once, count descriptors)"
                           "\n         --unix (with --local: an abstract Unix socket instead of loopback TCP)");
}

bool number(const char* text, uint64_t* out) { return rdmashim::parse_size(text, out); }

}  // namespace

bool parse_pingpong_args(const char* tool, int argc, char** argv, PingPongOptions* o, bool with_transport) {
  bool mode_set = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto value = [&](uint64_t* out) {
      if (i + 1 >= argc || !number(argv[i + 1], out)) {
        fprintf(stderr, "%s: %s needs a number\n", tool, a.c_str());
        return false;
      }
      ++i;
      return true;
    };
    uint64_t v = 0;
    if (a == "--local") {
      o->mode = PingPongOptions::Mode::kLocal;
      mode_set = true;
    } else if (a == "server") {
      o->mode = PingPongOptions::Mode::kServer;
      mode_set = true;
    } else if (a == "client") {
      o->mode = PingPongOptions::Mode::kClient;
      mode_set = true;
      if (i + 1 < argc && argv[i + 1][0] != '-') {
        std::string target = argv[++i];
        size_t colon = target.rfind(':');
        if (colon != std::string::npos && target.find(':') == colon) {
          if (!number(target.c_str() + colon + 1, &v) || v == 0 || v > 65535) {
            fprintf(stderr, "%s: bad port in %s\n", tool, target.c_str());
            return false;
          }
          o->port = static_cast<uint16_t>(v);
          target.resize(colon);
        }
        o->host = target;
      }
    } else if (a == "--size") {
      if (!value(&v) || v == 0 || v > (1u << 30)) return usage(tool, with_transport), false;
      o->size = v;
    } else if (a == "--iters") {
      if (!value(&v) || v == 0) return usage(tool, with_transport), false;
      o->iters = v;
    } else if (a == "--warmup") {
      if (!value(&v)) return usage(tool, with_transport), false;
      o->warmup = v;
    } else if (a == "--port") {
      if (!value(&v) || v > 65535) return usage(tool, with_transport), false;
      o->port = static_cast<uint16_t>(v);
    } else if (a == "--host" && i + 1 < argc) {
      o->host = argv[++i];
    } else if (a == "--stream") {
      o->stream = true;
    } else if (a == "--bytes") {
      if (!value(&v) || v == 0) return usage(tool, with_transport), false;
      o->bytes = v;
    } else if (a == "--idle-ms") {
      if (!value(&v) || v > 600000) return usage(tool, with_transport), false;
      o->idle_ms = v;
    } else if (a == "--ms") {
      if (!value(&v)) return usage(tool, with_transport), false;
      o->ms = v;
    } else if (a == "--rate") {
      if (!value(&v)) return usage(tool, with_transport), false;
      o->rate = v;
    } else if (!with_transport && a == "--unix") {
      o->unix_socket = true;
    } else if (a == "--json") {
      o->json = true;
    } else if (!with_transport && (a == "--connects" || a == "--hold")) {
      if (!value(&v) || v == 0 || v > 100000) return usage(tool, with_transport), false;
      (a == "--connects" ? o->connects : o->hold) = v;
    } else if (!with_transport && (a == "--then" || a == "--gap-ms")) {
      if (!value(&v) || v > 100000000) return usage(tool, with_transport), false;
      (a == "--then" ? o->then_iters : o->gap_ms) = v;
    } else if (!with_transport && a == "--busy") {
      if (!value(&v) || v == 0 || v > 64) return usage(tool, with_transport), false;
      o->busy = v;
    } else if (!with_transport && a == "--wait" && i + 1 < argc) {
      o->wait = argv[++i];
      if (o->wait != "block" && o->wait != "poll" && o->wait != "epoll") {
        fprintf(stderr, "%s: --wait takes block, poll or epoll\n", tool);
        return false;
      }
    } else if (with_transport && a == "--transport" && i + 1 < argc) {
      o->transport = argv[++i];
      TransportChoice ignored;
      if (!parse_transport(o->transport.c_str(), &ignored)) {
        fprintf(stderr, "%s: --transport takes %s\n", tool, kTransportNames);
        return false;
      }
    } else if (a == "-h" || a == "--help") {
      usage(tool, with_transport);
      exit(0);
    } else {
      fprintf(stderr, "%s: unknown argument %s\n", tool, a.c_str());
      usage(tool, with_transport);
      return false;
    }
  }
  if (!mode_set) {
    usage(tool, with_transport);
    return false;
  }
  if (o->mode == PingPongOptions::Mode::kClient && o->port == 0) {
    fprintf(stderr, "%s: client needs a port (HOST:PORT or --port)\n", tool);
    return false;
  }
  if (o->warmup == 0) o->warmup = std::min<uint64_t>(o->iters / 10, 10000);
  return true;
}

int serve_pingpong(Channel& ch, size_t size) {
  std::vector<char> buf(size);
  for (;;) {
    ssize_t n = ch.recv_all(buf.data(), size);
    if (n == 0) return 0;
    if (n < 0) return static_cast<int>(n);
    if (static_cast<size_t>(n) != size) return -EPROTO;  // EOF mid-message
    n = ch.send_all(buf.data(), size);
    if (n < 0) return static_cast<int>(n);
  }
}

int serve_stream(Channel& ch, const PingPongOptions& o) {
  std::vector<char> buf(o.size);
  for (uint64_t got = 0; got < o.bytes;) {
    size_t want = o.bytes - got < o.size ? static_cast<size_t>(o.bytes - got) : o.size;
    ssize_t n = ch.recv_all(buf.data(), want);
    if (n <= 0) return n == 0 ? -EPROTO : static_cast<int>(n);
    got += static_cast<uint64_t>(n);
  }
  char ack = 1;
  if (ch.send_all(&ack, 1) != 1) return -EIO;
  if (o.idle_ms == 0) return 0;
  // The client now sleeps in its read of the report: the connection is idle.
  timespec ts{static_cast<time_t>(o.idle_ms / 1000), static_cast<long>(o.idle_ms % 1000) * 1'000'000};
  nanosleep(&ts, nullptr);
  uint64_t held = ch.idle_memory ? ch.idle_memory() : 0;
  if (ch.send_all(&held, sizeof held) != static_cast<ssize_t>(sizeof held)) return -EIO;
  ssize_t n = ch.recv_all(buf.data(), 1);  // until the client closes
  return n < 0 ? static_cast<int>(n) : 0;
}

int run_stream_client(const char* tool, Channel& ch, const PingPongOptions& o) {
  std::vector<char> out(o.size);
  for (size_t i = 0; i < o.size; ++i) out[i] = static_cast<char>(i * 131 + 7);
  uint64_t start = now_ns();
  for (uint64_t sent = 0; sent < o.bytes;) {
    size_t len = o.bytes - sent < o.size ? static_cast<size_t>(o.bytes - sent) : o.size;
    if (o.rate) {  // paced: this write waits for its time (sleep when far, then poll the clock)
      uint64_t due = start + static_cast<uint64_t>(static_cast<double>(sent) * 1e9 / static_cast<double>(o.rate));
      for (uint64_t now = now_ns(); now < due; now = now_ns()) {
        if (due - now > 200'000) {
          timespec ts{0, static_cast<long>(due - now - 100'000)};
          nanosleep(&ts, nullptr);
        }
      }
    }
    if (ch.send_all(out.data(), len) != static_cast<ssize_t>(len)) {
      fprintf(stderr, "%s: send failed after %llu bytes: %s\n", tool, static_cast<unsigned long long>(sent),
              strerror(errno));
      return 1;
    }
    sent += len;
  }
  char ack = 0;
  if (ch.recv_all(&ack, 1) != 1) {
    fprintf(stderr, "%s: no answer after the stream\n", tool);
    return 1;
  }
  double seconds = static_cast<double>(now_ns() - start) / 1e9;
  double rate = static_cast<double>(o.bytes) / seconds;
  long long held = -1;
  if (o.idle_ms > 0) {
    uint64_t v = 0;
    if (ch.recv_all(&v, sizeof v) != static_cast<ssize_t>(sizeof v)) {
      fprintf(stderr, "%s: no memory report after the idle time\n", tool);
      return 1;
    }
    held = static_cast<long long>(v);
  }
  if (o.json) {
    printf("{\"tool\":%s,\"transport\":%s,\"size\":%zu,\"bytes\":%llu,\"seconds\":%.6f,"
           "\"bytes_per_s\":%.1f,\"idle_conn_bytes\":%lld}\n",
           json_quote(tool).c_str(), json_quote(ch.transport).c_str(), o.size,
           static_cast<unsigned long long>(o.bytes), seconds, rate, held);
  } else {
    printf("%s: %llu bytes in %zu-byte writes over %s: %.1f MB/s", tool, static_cast<unsigned long long>(o.bytes),
           o.size, ch.transport.c_str(), rate / 1e6);
    if (held >= 0) printf(", %lld bytes held by the idle connection", held);
    printf("\n");
  }
  return 0;
}

namespace {

// The first milliseconds of a connection, from every round trip (warm-up
// included): the rate of the first 1,000, and the time until a window of
// 100 round trips first has a median within 1.5x (+0.5 us) of the steady
// median (that of the last half).
struct WarmUp {
  double first_1000_per_s = 0, steady_after_us = 0;
};
WarmUp warm_up(const std::vector<uint32_t>& all) {
  WarmUp w;
  size_t n = all.size();
  if (n == 0) return w;
  auto median = [&](size_t from, size_t to) {
    std::vector<uint32_t> v(all.begin() + static_cast<long>(from), all.begin() + static_cast<long>(to));
    std::nth_element(v.begin(), v.begin() + static_cast<long>(v.size() / 2), v.end());
    return static_cast<double>(v[v.size() / 2]);
  };
  size_t first = std::min<size_t>(n, 1000);
  double sum = 0;
  for (size_t i = 0; i < first; ++i) sum += all[i];
  w.first_1000_per_s = static_cast<double>(first) * 1e9 / sum;
  constexpr size_t kWindow = 100;
  double steady = median(n / 2, n) * 1.5 + 500;
  double elapsed = 0;
  for (size_t i = 0; i + kWindow <= n; i += kWindow) {
    if (median(i, i + kWindow) <= steady) break;
    for (size_t j = i; j < i + kWindow; ++j) elapsed += all[j];
  }
  w.steady_after_us = elapsed / 1e3;
  return w;
}

// The rate of each half of the measured round trips (after the warm-up),
// from their times: whether the run was long enough that the rate no longer
// moves (bench/run flags a row whose halves differ by more than 5%).
std::pair<double, double> half_rates(const std::vector<uint32_t>& rtt) {
  size_t half = rtt.size() / 2;
  auto rate = [&](size_t from, size_t to) {
    double ns = 0;
    for (size_t i = from; i < to; ++i) ns += rtt[i];
    return ns > 0 ? static_cast<double>(to - from) * 1e9 / ns : 0.0;
  };
  return {rate(0, half), rate(half, rtt.size())};
}

}  // namespace

int run_pingpong_client(const char* tool, Channel& ch, const PingPongOptions& o) {
  std::vector<char> out(o.size), in(o.size);
  for (size_t i = 0; i < o.size; ++i) out[i] = static_cast<char>(i * 131 + 7);
  std::vector<uint32_t> rtt_ns, all_ns;
  constexpr uint64_t kReserve = uint64_t{1} << 22;
  rtt_ns.reserve(std::min(o.iters, kReserve));
  all_ns.reserve(std::min(o.warmup + o.iters, kReserve));
  uint64_t start = 0, iters = o.iters;
  // One clock read per round trip, as perftest takes one time stamp per
  // iteration: a round trip runs from the end of the one before, so the
  // times add up to the run, and where the clock is a system call and a
  // device read (a VM on the HPET) the tool does not pay it twice.
  uint64_t t0 = now_ns();
  const uint64_t deadline = o.ms ? t0 + o.ms * 1'000'000 : UINT64_MAX;
  for (uint64_t i = 0; i < o.warmup + o.iters; ++i) {
    if (i == o.warmup) start = t0;
    if (i > o.warmup && (i & 15) == 0 && t0 >= deadline) {
      iters = i - o.warmup;
      break;
    }
    out[0] = static_cast<char>(i);
    if (ch.send_all(out.data(), o.size) != static_cast<ssize_t>(o.size)) {
      fprintf(stderr, "%s: send failed at round trip %llu: %s\n", tool, static_cast<unsigned long long>(i),
              strerror(errno));
      return 1;
    }
    ssize_t n = ch.recv_all(in.data(), o.size);
    if (n != static_cast<ssize_t>(o.size)) {
      fprintf(stderr, "%s: %s at round trip %llu\n", tool, n == 0 ? "server closed the connection" : "receive failed",
              static_cast<unsigned long long>(i));
      return 1;
    }
    if (memcmp(in.data(), out.data(), o.size) != 0) {
      fprintf(stderr, "%s: echo mismatch at round trip %llu\n", tool, static_cast<unsigned long long>(i));
      return 1;
    }
    const uint64_t t1 = now_ns();
    uint64_t d = t1 - t0;
    t0 = t1;
    all_ns.push_back(static_cast<uint32_t>(d > UINT32_MAX ? UINT32_MAX : d));
    if (i >= o.warmup) rtt_ns.push_back(all_ns.back());
  }
  WarmUp w = warm_up(all_ns);
  auto [first_half, second_half] = half_rates(rtt_ns);
  double seconds = static_cast<double>(now_ns() - start) / 1e9;
  std::vector<uint32_t> sorted = rtt_ns;
  std::sort(sorted.begin(), sorted.end());
  auto pct = [&](double p) { return sorted[std::min(sorted.size() - 1, static_cast<size_t>(p * sorted.size()))] / 1e3; };
  double rate = static_cast<double>(iters) / seconds;
  double avg = seconds * 1e6 / static_cast<double>(iters);
  if (o.json) {
    printf("{\"tool\":%s,\"transport\":%s,\"size\":%zu,\"iters\":%llu,\"seconds\":%.6f,"
           "\"round_trips_per_s\":%.1f,\"avg_us\":%.3f,\"p50_us\":%.3f,\"p99_us\":%.3f,\"p999_us\":%.3f,\"max_us\":%.3f,"
           "\"first_1000_per_s\":%.1f,\"steady_after_us\":%.1f,\"first_half_per_s\":%.1f,\"second_half_per_s\":%.1f}\n",
           json_quote(tool).c_str(), json_quote(ch.transport).c_str(), o.size,
           static_cast<unsigned long long>(iters), seconds, rate, avg,
           pct(0.50), pct(0.99), pct(0.999), sorted.back() / 1e3, w.first_1000_per_s, w.steady_after_us, first_half,
           second_half);
  } else {
    printf("%s: %zu B x %llu round trips over %s: %.0f round trips/s, avg %.2f us, p50 %.2f us, p99 %.2f us\n",
           tool, o.size, static_cast<unsigned long long>(iters), ch.transport.c_str(), rate, avg, pct(0.50),
           pct(0.99));
  }
  return 0;
}

}  // namespace rdmashim::tools
