#include "cat/common.h"

#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cat/stream_format.h"
#include "json.h"
#include "util/config.h"

namespace rdmashim::cat {

// ---------------------------------------------------------------------------
// Arguments

std::string Endpoint::text() const {
  bool v6 = host.find(':') != std::string::npos;
  return (v6 ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

bool parse_bytes(const char* text, uint64_t lo, uint64_t hi, uint64_t* out) {
  uint64_t v = 0;
  if (!text || !rdmashim::parse_size(text, &v) || v < lo || v > hi) return false;
  *out = v;
  return true;
}

OptionParse parse_common_option(const char* tool, const std::string& a, const char* (*next)(void*), void* ctx,
                                CommonOptions* o) {
  if (a == "--verify") {
    o->verify = true;
  } else if (a == "--json") {
    o->json = true;
  } else if (a == "-v" || a == "--verbose") {
    o->verbose = true;
  } else if (a == "--no-progress") {
    o->progress = false;
  } else if (a == "--transport") {
    const char* t = next(ctx);
    if (!t || !valid_transport(t)) {
      fprintf(stderr, "%s: --transport takes auto, shm, verbs or tcp\n", tool);
      return OptionParse::kBad;
    }
    o->transport = t;
  } else if (a == "--buffers") {
    if (!parse_bytes(next(ctx), 2, 64, &o->buffers)) {
      fprintf(stderr, "%s: --buffers takes 2..64\n", tool);
      return OptionParse::kBad;
    }
  } else {
    return OptionParse::kNotCommon;
  }
  return OptionParse::kTaken;
}

bool valid_transport(const std::string& t) {
  TransportChoice ignored;
  return parse_transport(t.c_str(), &ignored);
}

bool transport_matches(const std::string& asked, const char* got) {
  if (asked.empty() || asked == "auto") return true;
  if (asked == "tcp") return strncmp(got, "tcp", 3) == 0;
  return asked == got;
}

bool parse_endpoint(const std::string& text, const char* default_host, bool port_alone_ok, Endpoint* out) {
  std::string host, port;
  if (!text.empty() && text[0] == '[') {
    size_t close = text.find(']');
    if (close == std::string::npos) return false;
    host = text.substr(1, close - 1);
    std::string rest = text.substr(close + 1);
    if (!rest.empty()) {
      if (rest[0] != ':') return false;
      port = rest.substr(1);
      if (port.empty()) return false;
    }
  } else {
    size_t colon = text.rfind(':');
    if (colon != std::string::npos && text.find(':') != colon) {
      host = text;  // a bare IPv6 address, no port
    } else if (colon != std::string::npos) {
      host = text.substr(0, colon);
      port = text.substr(colon + 1);
      if (port.empty()) return false;
    } else if (port_alone_ok && !text.empty() && text.find_first_not_of("0123456789") == std::string::npos) {
      port = text;
    } else {
      host = text;
    }
  }
  uint64_t p = kDefaultPort;
  if (!port.empty()) {
    if (port.find_first_not_of("0123456789") != std::string::npos || port.size() > 5) return false;
    p = strtoull(port.c_str(), nullptr, 10);
    if (p > 65535) return false;
  }
  out->host = host.empty() ? default_host : host;
  out->port = static_cast<uint16_t>(p);
  return !out->host.empty();
}

// ---------------------------------------------------------------------------
// SlotPool

SlotPool::SlotPool(size_t count, size_t capacity, size_t headroom) : capacity_(capacity) {
  // Each slot: headroom, then data starting on a 4 KiB boundary.
  size_t head = (headroom + 4095) & ~size_t{4095};
  size_t stride = head + ((capacity + 4095) & ~size_t{4095});
  map_len_ = stride * count;
  size_t align = size_t{2} << 20;
  void* p = mmap(nullptr, map_len_ + align, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  if (p == MAP_FAILED) return;
  // Trim to a 2 MiB-aligned start so transparent huge pages can back it.
  uintptr_t start = (reinterpret_cast<uintptr_t>(p) + align - 1) & ~(align - 1);
  size_t before = start - reinterpret_cast<uintptr_t>(p);
  if (before) munmap(p, before);
  size_t after = align - before;
  if (after) munmap(reinterpret_cast<char*>(start) + map_len_, after);
  map_ = reinterpret_cast<void*>(start);
  madvise(map_, map_len_, MADV_HUGEPAGE);
  slots_.resize(count);
  for (size_t i = 0; i < count; ++i) {
    slots_[i].data = static_cast<char*>(map_) + i * stride + head;
    empty_.push_back(&slots_[i]);
  }
}

SlotPool::~SlotPool() {
  if (map_) munmap(map_, map_len_);
}

Slot* SlotPool::take_empty_locked(std::unique_lock<std::mutex>& lock, int timeout_ms) {
  auto ready = [&] { return cancelled_ || !empty_.empty(); };
  if (timeout_ms < 0) empty_cv_.wait(lock, ready);
  else empty_cv_.wait_for(lock, std::chrono::milliseconds(timeout_ms), ready);
  if (cancelled_ || empty_.empty()) return nullptr;
  Slot* s = empty_.front();
  empty_.pop_front();
  s->len = 0;
  s->last = false;
  s->error = 0;
  return s;
}

Slot* SlotPool::get_empty(int timeout_ms) {
  std::unique_lock<std::mutex> lock(mu_);
  return take_empty_locked(lock, timeout_ms);
}

Slot* SlotPool::get_full() {
  std::unique_lock<std::mutex> lock(mu_);
  full_cv_.wait(lock, [&] { return cancelled_ || !full_.empty() || (stage_ && stage_open_ && stage_->len > 0); });
  if (cancelled_) return nullptr;
  Slot* s;
  if (!full_.empty()) {
    s = full_.front();
    full_.pop_front();
  } else {
    s = std::exchange(stage_, nullptr);
  }
  return s;
}

void SlotPool::put_full(Slot* s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    full_.push_back(s);
  }
  full_cv_.notify_one();
}

void SlotPool::put_empty(Slot* s) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    empty_.push_back(s);
  }
  empty_cv_.notify_one();
}

void SlotPool::cancel() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    cancelled_ = true;
  }
  empty_cv_.notify_all();
  full_cv_.notify_all();
}

Slot* SlotPool::stage_claim() {
  std::unique_lock<std::mutex> lock(mu_);
  if (!stage_) {
    Slot* s = take_empty_locked(lock);
    if (!s) return nullptr;
    stage_ = s;  // only the network thread stages: nobody else set it meanwhile
  }
  stage_open_ = false;
  return stage_;
}

void SlotPool::stage_commit(size_t added, bool boundary) {
  bool notify = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!stage_) return;
    stage_->len += added;
    stage_open_ = boundary;
    if (stage_->len == capacity_) {
      full_.push_back(std::exchange(stage_, nullptr));
      notify = true;
    } else {
      notify = boundary && stage_->len > 0;
    }
  }
  if (notify) full_cv_.notify_one();
}

void SlotPool::stage_flush() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stage_open_ = false;
    if (stage_ && stage_->len > 0) full_.push_back(stage_);
    else if (stage_) empty_.push_back(stage_);
    stage_ = nullptr;
  }
  full_cv_.notify_one();
}

// ---------------------------------------------------------------------------
// Progress

Progress::Progress(const char* tool, const std::atomic<uint64_t>& bytes, bool enabled)
    : tool_(tool), bytes_(bytes), enabled_(enabled && isatty(2)) {}

Progress::~Progress() { stop(); }

void Progress::start(uint64_t total, uint64_t start_ns) {
  if (!enabled_ || thread_.joinable()) return;
  total_ = total;
  start_ns_ = start_ns;
  thread_ = std::thread([this] { run(); });
}

void Progress::stop() {
  if (!thread_.joinable()) return;
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  fputs("\r\033[K", stderr);
  fflush(stderr);
}

void Progress::run() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!cv_.wait_for(lock, std::chrono::milliseconds(500), [&] { return stop_; })) {
    uint64_t b = bytes_.load(std::memory_order_relaxed);
    double s = static_cast<double>(now_ns() - start_ns_) / 1e9;
    double rate = s > 0 ? static_cast<double>(b) / s : 0;
    char line[160];
    int n = snprintf(line, sizeof line, "\r\033[K%s: %s", tool_, human_bytes(b).c_str());
    if (total_ != kUnknownSize) n += snprintf(line + n, sizeof line - n, " of %s", human_bytes(total_).c_str());
    n += snprintf(line + n, sizeof line - n, "  %.2f GB/s", rate / 1e9);
    if (total_ != kUnknownSize && rate > 0 && total_ >= b) {
      uint64_t eta = static_cast<uint64_t>(static_cast<double>(total_ - b) / rate + 0.5);
      snprintf(line + n, sizeof line - n, "  ETA %" PRIu64 ":%02" PRIu64, eta / 60, eta % 60);
    }
    fputs(line, stderr);
    fflush(stderr);
  }
}

std::string human_bytes(uint64_t n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[32];
  snprintf(buf, sizeof buf, u == 0 ? "%.0f %s" : "%.2f %s", v, units[u]);
  return buf;
}

std::string json_summary(const char* tool, uint64_t bytes, double seconds, const char* transport, bool verified,
                         uint64_t checksum) {
  char buf[256];
  double rate = seconds > 0 ? static_cast<double>(bytes) / seconds : 0;
  snprintf(buf, sizeof buf, "{\"bytes\":%" PRIu64 ",\"seconds\":%.6f,\"bytes_per_s\":%.0f,", bytes, seconds, rate);
  std::string out = buf;
  out += "\"transport\":" + tools::json_quote(transport) + ",\"tool\":" + tools::json_quote(tool);
  out += verified ? ",\"verified\":true" : ",\"verified\":false";
  if (verified) {
    snprintf(buf, sizeof buf, ",\"xxh64\":\"%016" PRIx64 "\"", checksum);
    out += buf;
  }
  return out + "}";
}

// ---------------------------------------------------------------------------
// I/O

size_t send_exact(Stream& s, const void* buf, size_t len, int* err, const std::atomic<bool>* abort) {
  size_t done = 0;
  *err = 0;
  while (done < len) {
    ssize_t n = s.send(static_cast<const char*>(buf) + done, len - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == -EINTR && !(abort && abort->load(std::memory_order_relaxed))) continue;
    *err = n == 0 ? EPIPE : static_cast<int>(-n);
    break;
  }
  return done;
}

size_t recv_exact(Stream& s, void* buf, size_t len, int* err, const std::atomic<bool>* abort) {
  size_t done = 0;
  *err = 0;
  while (done < len) {
    ssize_t n = s.recv(static_cast<char*>(buf) + done, len - done);
    if (n > 0) {
      done += static_cast<size_t>(n);
      continue;
    }
    if (n == 0) break;  // EOF
    if (n == -EINTR && !(abort && abort->load(std::memory_order_relaxed))) continue;
    *err = static_cast<int>(-n);
    break;
  }
  return done;
}

void set_recv_timeout(int fd, int ms) {
  timeval tv{ms / 1000, (ms % 1000) * 1000};
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
}

void set_keepalive(int fd) {
  int one = 1, idle = 10, intvl = 5, cnt = 4;
  setsockopt(fd, SOL_SOCKET, SO_KEEPALIVE, &one, sizeof one);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPIDLE, &idle, sizeof idle);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPINTVL, &intvl, sizeof intvl);
  setsockopt(fd, IPPROTO_TCP, TCP_KEEPCNT, &cnt, sizeof cnt);
}

void grow_pipe(int fd) {
  struct stat st{};
  if (fstat(fd, &st) != 0 || !S_ISFIFO(st.st_mode)) return;
  int current = fcntl(fd, F_GETPIPE_SZ);
  if (current >= 0 && current < (1 << 20)) (void)fcntl(fd, F_SETPIPE_SZ, 1 << 20);
}

int write_full(int fd, const char* buf, size_t len) {
  while (len > 0) {
    ssize_t n = write(fd, buf, len);
    if (n > 0) {
      buf += n;
      len -= static_cast<size_t>(n);
      continue;
    }
    if (n < 0 && errno == EINTR) continue;
    return n < 0 ? errno : EIO;
  }
  return 0;
}

uint64_t test_corrupt_offset() {
  const char* t = getenv("RDMACAT_TEST_CORRUPT_AT");
  uint64_t v = 0;
  if (!t || !*t || !rdmashim::parse_size(t, &v)) return ~uint64_t{0};
  return v;
}

const char* status_text(ReplyStatus s) {
  switch (s) {
    case kOk: return "ok";
    case kCountMismatch: return "byte count mismatch";
    case kChecksumMismatch: return "checksum mismatch";
    case kOutputFailed: return "writing its output failed";
    case kProtocolError: return "protocol error";
  }
  return "unknown status";
}

}  // namespace rdmashim::cat
