// What rdma_send and rdma_recv share besides the stream format: argument
// helpers, the buffer pool that lets a reader/writer thread overlap with the
// network, the progress line, the JSON summary and a few I/O loops.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "api/stream.h"
#include "util/misc.h"

namespace rdmashim::cat {

// Exit codes (the README's table).
constexpr int kExitOk = 0;
constexpr int kExitFailed = 1;  // the transfer failed: peer died, short stream, mismatch, output closed
constexpr int kExitUsage = 2;

// "HOST:PORT", "HOST", ":PORT", "PORT" (listen only), "[V6]:PORT", "[V6]".
// A missing host is `default_host`, a missing port kDefaultPort.
struct Endpoint {
  std::string host;
  uint16_t port = 0;
  std::string text() const;
};
bool parse_endpoint(const std::string& text, const char* default_host, bool port_alone_ok, Endpoint* out);

// Parses a size with an optional k/m/g suffix (binary), within [lo, hi].
bool parse_bytes(const char* text, uint64_t lo, uint64_t hi, uint64_t* out);
bool valid_transport(const std::string& t);
// Whether the transport a Stream reports ("shm", "tcp:<reason>", ...) is
// the one --transport asked for (nothing or "auto": anything is).
bool transport_matches(const std::string& asked, const char* got);

// The options both tools take: --verify, --json, -v/--verbose,
// --no-progress, --transport T, --buffers N.
struct CommonOptions {
  bool verify = false;
  bool json = false;
  bool verbose = false;
  bool progress = true;
  std::string transport;
  uint64_t buffers = 4;
};
enum class OptionParse { kNotCommon, kTaken, kBad };
// Takes argument `a` if it is a common option (`next` yields its value);
// kBad after printing why on stderr.
OptionParse parse_common_option(const char* tool, const std::string& a, const char* (*next)(void*), void* ctx,
                                CommonOptions* o);

// A fixed set of equally sized buffers passed between one producer and one
// consumer thread: "empty" buffers go to the producer, "full" ones to the
// consumer, in order. `headroom` bytes before each buffer's data are free
// for a header (rdma_send puts its Record there, so header and payload go
// out in one send). One mapping, 2 MiB aligned, hugepage-advised.
struct Slot {
  char* data = nullptr;
  size_t len = 0;     // bytes of data in use
  bool last = false;  // producer: no more data after this slot (len may be 0)
  int error = 0;      // producer: errno of the failure that ended the data
};

class SlotPool {
 public:
  SlotPool(size_t count, size_t capacity, size_t headroom);
  ~SlotPool();
  SlotPool(const SlotPool&) = delete;
  SlotPool& operator=(const SlotPool&) = delete;

  size_t capacity() const { return capacity_; }
  // Block (get_empty: at most timeout_ms, if >= 0); nullptr once cancel()
  // was called or on timeout.
  Slot* get_empty(int timeout_ms = -1);
  Slot* get_full();
  void put_full(Slot* s);
  void put_empty(Slot* s);
  void cancel();

  // rdma_recv's staging slot: the network thread receives record after
  // record into it; it goes to the writer when full, and the writer also
  // takes it by itself when it would otherwise sit idle while the network
  // thread waits between records. So a slow, interactive stream is never
  // held back, and a fast one is written out in large pieces.
  //   stage_claim():   the staging slot to receive into (a new one if
  //                    needed; nullptr once cancelled). Not takeable until
  //                    the commit.
  //   stage_commit(n, boundary): n more bytes are in it; `boundary`: the
  //                    network thread is between records (the writer may
  //                    take the slot now). A full slot is queued at once.
  //   stage_flush():   queue the staging slot (if it holds anything) now.
  // get_full() returns queued slots first, then a takeable staging slot.
  Slot* stage_claim();
  void stage_commit(size_t added, bool boundary);
  void stage_flush();
  bool ok() const { return map_ != nullptr; }

 private:
  Slot* take_empty_locked(std::unique_lock<std::mutex>& lock, int timeout_ms = -1);

  std::mutex mu_;
  std::condition_variable empty_cv_, full_cv_;
  std::deque<Slot*> empty_, full_;
  std::vector<Slot> slots_;
  Slot* stage_ = nullptr;
  bool stage_open_ = false;  // committed at a record boundary: the writer may take it
  bool cancelled_ = false;
  void* map_ = nullptr;
  size_t map_len_ = 0;
  size_t capacity_;
};

// A progress line on stderr, refreshed twice a second, only when stderr is
// a terminal: "rdma_recv: 1.2 GiB of 4.0 GiB  1.53 GB/s  ETA 0:02".
class Progress {
 public:
  Progress(const char* tool, const std::atomic<uint64_t>& bytes, bool enabled);
  ~Progress();
  void start(uint64_t total, uint64_t start_ns);  // total: kUnknownSize if unknown
  void stop();  // clears the line

 private:
  void run();
  const char* tool_;
  const std::atomic<uint64_t>& bytes_;
  bool enabled_;
  uint64_t total_ = 0;
  uint64_t start_ns_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::thread thread_;
};

std::string human_bytes(uint64_t n);

// The one-line summary: {"bytes":..,"seconds":..,"bytes_per_s":..,"transport":"..",...}.
std::string json_summary(const char* tool, uint64_t bytes, double seconds, const char* transport, bool verified,
                         uint64_t checksum);

// Loops over a Stream until len bytes moved, EOF or an error. Returns the
// count moved (len on success) and sets *err to 0 (EOF) or a positive errno.
// EINTR is retried unless *abort is set.
size_t send_exact(Stream& s, const void* buf, size_t len, int* err, const std::atomic<bool>* abort = nullptr);
size_t recv_exact(Stream& s, void* buf, size_t len, int* err, const std::atomic<bool>* abort = nullptr);

// Socket options on the stream's TCP socket (which rdmashim also honours on
// the ring): a receive timeout (0: none), and keep-alive probes so a peer
// host that vanishes without a FIN/RST is noticed in about 30 s.
void set_recv_timeout(int fd, int ms);
void set_keepalive(int fd);
// Grows a pipe to 1 MiB (best effort; no-op for anything but a pipe).
void grow_pipe(int fd);
// write() loop: 0, or a positive errno.
int write_full(int fd, const char* buf, size_t len);

// Test hook (tools/cat/README.md): RDMACAT_TEST_CORRUPT_AT=N
// flips one bit of payload byte N in rdma_send after the checksum was taken,
// so the tests can prove --verify catches corruption. Returns ~0 if unset.
uint64_t test_corrupt_offset();

}  // namespace rdmashim::cat
