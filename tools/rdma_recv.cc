// rdma_recv: accepts one rdma_send and writes what it sends to stdout, over
// rdmashim's core transport (shared memory on one host, TCP otherwise).
//
//   rdma_recv [options]            (listens on 0.0.0.0:18515 by default)
//
// The main thread receives records into large buffers while a writer thread
// drains full ones to stdout. The transfer succeeds (exit 0) only if the
// stream ended with a valid trailer whose count (and, with --verify, whose
// checksum) matches what was written; then rdma_send is told so.
// stdout carries the data: --json, --verbose and the progress line go to
// stderr.
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>

#include "api/stream.h"
#include "cat/common.h"
#include "cat/stream_format.h"
#include "cat/checksum.h"

using namespace rdmashim::cat;
using rdmashim::Listener;
using rdmashim::now_ns;
using rdmashim::Stream;

namespace {

const char* kTool = "rdma_recv";

struct Options : CommonOptions {
  Endpoint listen{"0.0.0.0", kDefaultPort};
  std::string port_file;
  uint64_t buffer = 1 << 20;
  uint64_t header_timeout_s = 10;
};

void usage(FILE* f) {
  fprintf(f,
          "usage: rdma_recv [options]\n"
          "Accepts one rdma_send, writes what it sends to stdout, and exits.\n"
          "Exits 0 only when the whole stream arrived intact; 1 when the transfer failed (sender died, short\n"
          "stream, checksum mismatch, stdout closed); 2 on usage errors.\n"
          "options:\n"
          "  --listen ADDR:PORT  where to listen (default 0.0.0.0:%u; also ADDR, :PORT, PORT, [V6]:PORT)\n"
          "  --verify            ask for an end-to-end XXH64 checksum and check it\n"
          "  --json              one-line summary on STDERR (stdout carries the data):\n"
          "                      {\"bytes\":..,\"seconds\":..,\"bytes_per_s\":..,\"transport\":..}\n"
          "  -v, --verbose       say where it listens, who connected and over which transport (stderr)\n"
          "  --transport T       auto|shm|verbs|tcp (sets RDMASHIM_TRANSPORT; default: the environment's, else auto)\n"
          "  --port-file PATH    write the listening port to PATH once listening (for scripts; use with port 0)\n"
          "  --no-progress       no progress line (it is shown only when stderr is a terminal)\n"
          "  --buffer BYTES      size of one stdout write buffer (default 1m; 64k..64m)\n"
          "  --buffers N         write-behind buffers (default 4; 2..64)\n",
          kDefaultPort);
}

int parse(int argc, char** argv, Options* o) {
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto next = [&]() -> const char* { return i + 1 < argc ? argv[++i] : nullptr; };
    auto next_arg = [](void* l) { return (*static_cast<decltype(next)*>(l))(); };
    OptionParse common = parse_common_option(kTool, a, next_arg, &next, o);
    if (common == OptionParse::kBad) return kExitUsage;
    if (common == OptionParse::kTaken) continue;
    if (a == "-h" || a == "--help") {
      usage(stdout);
      exit(kExitOk);
    } else if (a == "--listen" || a == "-l") {
      const char* t = next();
      if (!t || !parse_endpoint(t, "0.0.0.0", true, &o->listen)) {
        fprintf(stderr, "%s: --listen takes ADDR:PORT, ADDR, :PORT or PORT\n", kTool);
        return kExitUsage;
      }
    } else if (a == "--port-file") {
      const char* t = next();
      if (!t || !*t) {
        fprintf(stderr, "%s: --port-file takes a path\n", kTool);
        return kExitUsage;
      }
      o->port_file = t;
    } else if (a == "--buffer") {
      if (!parse_bytes(next(), 64 << 10, 64 << 20, &o->buffer)) {
        fprintf(stderr, "%s: --buffer takes 64k..64m\n", kTool);
        return kExitUsage;
      }
    } else {
      fprintf(stderr, "%s: unknown argument %s\n", kTool, a.c_str());
      usage(stderr);
      return kExitUsage;
    }
  }
  return -1;
}

[[noreturn]] void die() {
  fflush(stderr);
  _exit(kExitFailed);
}

void on_wake(int) {}

// Drains full slots to stdout, in order; hashes what it wrote.
struct Writer {
  SlotPool* pool = nullptr;
  bool verify = false;
  Xxh64 hash;
  std::atomic<uint64_t> written{0};
  std::atomic<bool> failed{false};  // output failed: the network thread must stop
  std::atomic<bool> done{false};
  int error = 0;                    // valid once failed or done
  pthread_t network_thread{};
  std::atomic<bool> network_stopped{false};

  void run() {
    uint64_t total = 0;
    for (;;) {
      Slot* s = pool->get_full();
      if (!s) break;
      if (s->last) {
        pool->put_empty(s);
        break;
      }
      if (int e = write_full(1, s->data, s->len); e != 0) {
        error = e;
        failed.store(true, std::memory_order_release);
        pool->cancel();
        // The network thread may be blocked in a receive: interrupt it until
        // it noticed (a signal can land just before it starts to wait).
        while (!network_stopped.load(std::memory_order_acquire)) {
          pthread_kill(network_thread, SIGUSR1);
          usleep(20 * 1000);
        }
        return;
      }
      if (verify) hash.update(s->data, s->len);
      total += s->len;
      written.store(total, std::memory_order_release);
      pool->put_empty(s);
    }
    done.store(true, std::memory_order_release);
  }
};

void write_port_file(const std::string& path, uint16_t port) {
  std::string tmp = path + ".tmp";
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f || fprintf(f, "%u\n", port) < 0 || fclose(f) != 0 || rename(tmp.c_str(), path.c_str()) != 0) {
    fprintf(stderr, "%s: cannot write %s: %s\n", kTool, path.c_str(), strerror(errno));
    die();
  }
}

std::string of_total(uint64_t got, const Header& h) {
  char buf[96];
  if (h.size != kUnknownSize) snprintf(buf, sizeof buf, "%" PRIu64 " of %" PRIu64 " bytes", got, h.size);
  else snprintf(buf, sizeof buf, "%" PRIu64 " bytes", got);
  return buf;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = parse(argc, argv, &o); rc >= 0) return rc;
  signal(SIGPIPE, SIG_IGN);  // a closed stdout is reported as EPIPE, with a message
  struct sigaction sa{};
  sa.sa_handler = on_wake;  // no SA_RESTART: interrupts a blocked receive
  sigemptyset(&sa.sa_mask);
  sigaction(SIGUSR1, &sa, nullptr);
  if (!o.transport.empty()) setenv("RDMASHIM_TRANSPORT", o.transport.c_str(), 1);
  {
    struct stat st{};
    if (fstat(1, &st) != 0) {
      fprintf(stderr, "%s: stdout is closed\n", kTool);
      return kExitFailed;
    }
  }
  grow_pipe(1);

  int err = 0;
  Listener l = Listener::listen(o.listen.host.c_str(), o.listen.port, &err);
  if (!l) {
    fprintf(stderr, "%s: cannot listen on %s: %s\n", kTool, o.listen.text().c_str(),
            err == -EHOSTUNREACH ? "unknown address" : strerror(-err));
    return kExitFailed;
  }
  if (!o.port_file.empty()) write_port_file(o.port_file, l.port());
  if (o.verbose) fprintf(stderr, "%s: listening on %s\n", kTool, Endpoint{o.listen.host, l.port()}.text().c_str());

  // Accept until an rdma_send shows up (a stray connection is dropped).
  Stream s;
  Header h{};
  for (;;) {
    s = l.accept(&err);
    if (!s) {
      if (err == -EINTR || err == -ECONNABORTED) continue;
      fprintf(stderr, "%s: accept: %s\n", kTool, strerror(-err));
      return kExitFailed;
    }
    set_keepalive(s.fd());
    set_recv_timeout(s.fd(), static_cast<int>(o.header_timeout_s * 1000));
    size_t got = recv_exact(s, &h, sizeof h, &err);
    if (got != sizeof h || !valid(h)) {
      fprintf(stderr, "%s: warning: dropped a connection that is not rdma_send (%s)\n", kTool,
              got == sizeof h ? "bad header"
              : err == EAGAIN ? "no header in time"
              : err           ? strerror(err)
                              : "closed early");
      continue;
    }
    Greeting g = make_greeting(o.verify ? kWantChecksum : 0);
    if (send_exact(s, &g, sizeof g, &err) == sizeof g) break;
    fprintf(stderr, "%s: warning: dropped a connection that closed at once (%s)\n", kTool, strerror(err));
  }
  l = Listener();  // one transfer: later connections are refused
  set_recv_timeout(s.fd(), 0);
  const char* transport = s.transport();
  // The sender checksums iff it was asked to or we ask it to (the Greeting).
  bool verify = o.verify || (h.flags & kHasChecksum) != 0;
  if (o.verbose) fprintf(stderr, "%s: receiving over %s\n", kTool, transport);
  if (!transport_matches(o.transport, transport))
    fprintf(stderr, "%s: warning: asked for transport %s, using %s\n", kTool, o.transport.c_str(), transport);

  SlotPool pool(o.buffers, o.buffer, 0);
  if (!pool.ok()) {
    fprintf(stderr, "%s: cannot allocate %" PRIu64 " buffers of %" PRIu64 " bytes\n", kTool, o.buffers, o.buffer);
    die();
  }
  Writer writer;
  writer.pool = &pool;
  writer.verify = verify;
  writer.network_thread = pthread_self();
  uint64_t start = now_ns();
  std::thread write_thread([&] { writer.run(); });

  std::atomic<uint64_t> received{0};
  Progress progress(kTool, received, o.progress);
  progress.start(h.size, start);

  // Stops the transfer: tells the sender why (best effort), says it here,
  // exits 1. The writer keeps what it has, for at most a second.
  auto fail = [&](ReplyStatus status, uint32_t error, const std::string& message) {
    writer.network_stopped.store(true, std::memory_order_release);
    if (!writer.failed.load(std::memory_order_acquire)) {
      pool.stage_flush();
      // Let the writer write out what arrived, unless its output is stuck.
      uint64_t give_up = now_ns() + 1000000000ull;
      Slot* end = pool.get_empty(1000);
      if (end) {
        end->last = true;
        pool.put_full(end);
        while (!writer.done.load() && !writer.failed.load() && now_ns() < give_up) usleep(1000);
      }
    }
    progress.stop();
    Reply r = make_reply(status, error, writer.written.load(), 0);
    int e = 0;
    send_exact(s, &r, sizeof r, &e);
    fprintf(stderr, "%s: %s\n", kTool, message.c_str());
    die();
  };
  auto output_failed = [&] {
    char msg[256];
    snprintf(msg, sizeof msg, "writing to stdout failed after %" PRIu64 " bytes: %s%s", writer.written.load(),
             strerror(writer.error), writer.error == EPIPE ? " (the reader of our output exited)" : "");
    fail(kOutputFailed, static_cast<uint32_t>(writer.error), msg);
  };
  auto lost = [&](int e, uint64_t pos) {
    if (writer.failed.load(std::memory_order_acquire)) output_failed();
    char msg[256];
    if (e == 0)
      snprintf(msg, sizeof msg, "sender closed the connection after %s, before the end of the stream",
               of_total(pos, h).c_str());
    else
      snprintf(msg, sizeof msg, "connection to the sender failed after %s: %s", of_total(pos, h).c_str(),
               strerror(e));
    fail(kProtocolError, 0, msg);
  };

  const std::atomic<bool>* abort = &writer.failed;
  uint64_t pos = 0;
  Trailer t{};
  for (;;) {
    Record r{};
    size_t got = recv_exact(s, &r, sizeof r, &err, abort);
    if (writer.failed.load(std::memory_order_acquire)) output_failed();
    if (got != sizeof r) lost(err, pos);
    if (valid_end(r)) {
      t.end = r;
      got = recv_exact(s, reinterpret_cast<char*>(&t) + sizeof r, kTrailerRest, &err, abort);
      if (got != kTrailerRest) lost(err, pos);
      if (!valid_rest(t) || (verify && !(t.flags & kHasChecksum))) {
        fail(kProtocolError, 0, verify ? "protocol error: the sender did not send the checksum asked for"
                                       : "protocol error: bad trailer");
      }
      break;
    }
    if (!valid_data(r, pos)) {
      char msg[256];
      snprintf(msg, sizeof msg, "protocol error: bad record after %" PRIu64 " bytes (type %08x, length %u, offset %" PRIu64
               ")", pos, r.type, r.length, r.position);
      fail(kProtocolError, 0, msg);
    }
    uint64_t left = r.length;
    while (left > 0) {
      Slot* slot = pool.stage_claim();
      if (!slot) output_failed();  // cancelled by the writer
      size_t take = std::min<uint64_t>(left, pool.capacity() - slot->len);
      got = recv_exact(s, slot->data + slot->len, take, &err, abort);
      left -= got;
      pos += got;
      pool.stage_commit(got, left == 0);
      received.store(pos, std::memory_order_relaxed);
      if (got != take) lost(err, pos);
    }
  }

  // End of stream: everything must reach stdout before we answer.
  pool.stage_flush();
  Slot* end = pool.get_empty();
  if (!end) output_failed();
  end->last = true;
  pool.put_full(end);
  // Nothing left to receive: a writer that fails now must not wait for us
  // to notice its signal.
  writer.network_stopped.store(true, std::memory_order_release);
  write_thread.join();
  if (writer.failed.load()) output_failed();
  uint64_t endt = now_ns();
  progress.stop();
  uint64_t written = writer.written.load();
  uint64_t digest = verify ? writer.hash.digest() : 0;
  if (t.end.position != pos || written != pos) {
    char msg[256];
    snprintf(msg, sizeof msg, "sender says it sent %" PRIu64 " bytes but %" PRIu64 " arrived", t.end.position, pos);
    fail(kCountMismatch, 0, msg);
  }
  if (verify && digest != t.checksum) {
    char msg[256];
    snprintf(msg, sizeof msg, "checksum mismatch over %" PRIu64 " bytes: sender xxh64 %016" PRIx64
             ", received %016" PRIx64, pos, t.checksum, digest);
    fail(kChecksumMismatch, 0, msg);
  }
  if (close(1) != 0 && errno != EINTR) {
    writer.error = errno;
    output_failed();
  }
  Reply reply = make_reply(kOk, 0, written, digest);
  if (send_exact(s, &reply, sizeof reply, &err) != sizeof reply)
    fprintf(stderr, "%s: warning: could not confirm the transfer to the sender: %s\n", kTool, strerror(err));
  double seconds = static_cast<double>(endt - start) / 1e9;
  if (o.verbose)
    fprintf(stderr, "%s: received %" PRIu64 " bytes in %.3f s (%.2f GB/s) over %s%s\n", kTool, pos, seconds,
            seconds > 0 ? static_cast<double>(pos) / seconds / 1e9 : 0.0, transport,
            verify ? ", checksum verified" : "");
  if (o.json) fprintf(stderr, "%s\n", json_summary(kTool, pos, seconds, transport, verify, digest).c_str());
  return kExitOk;
}
