// rdma_send: reads stdin (or FILE) and sends it to an rdma_recv, over
// rdmashim's core transport (shared memory on one host, TCP otherwise).
//
//   rdma_send [options] HOST[:PORT] [FILE]
//
// A reader thread fills buffers from the input while the main thread sends
// the previous ones; the stream inside the connection is framed
// (tools/cat/stream_format.h) so the receiver can tell a complete transfer
// from a short one, and rdma_send exits 0 only after rdma_recv confirmed
// that every byte reached its stdout.
#include <fcntl.h>
#include <poll.h>
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
using rdmashim::now_ns;
using rdmashim::Stream;

namespace {

const char* kTool = "rdma_send";

struct Options : CommonOptions {
  Endpoint target;
  std::string file;  // empty or "-": stdin
  uint64_t chunk = 1 << 20;
  uint64_t wait_s = 5;
  uint64_t greet_timeout_s = 10;
};

void usage(FILE* f) {
  fprintf(f,
          "usage: rdma_send [options] HOST[:PORT] [FILE]\n"
          "Sends FILE (default: stdin) to an rdma_recv listening on HOST:PORT (port %u by default).\n"
          "Exits 0 only when rdma_recv confirmed every byte; 1 when the transfer failed; 2 on usage errors.\n"
          "options:\n"
          "  --verify           end-to-end XXH64 checksum, checked by rdma_recv\n"
          "  --json             one-line summary on stdout: {\"bytes\":..,\"seconds\":..,\"bytes_per_s\":..,\"transport\":..}\n"
          "  -v, --verbose      say which transport was used (stderr)\n"
          "  --transport T      auto|shm|verbs|tcp (sets RDMASHIM_TRANSPORT; default: the environment's, else auto)\n"
          "  --no-progress      no progress line (it is shown only when stderr is a terminal)\n"
          "  --wait SECONDS     keep retrying a refused connection this long (default 5; 0: once)\n"
          "  --chunk BYTES      read/send unit (default 1m; 4k..16m)\n"
          "  --buffers N        read-ahead buffers (default 4; 2..64)\n",
          kDefaultPort);
}

int parse(int argc, char** argv, Options* o) {
  std::string target;
  bool have_file = false;
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
    } else if (a == "--wait") {
      if (!parse_bytes(next(), 0, 86400, &o->wait_s)) {
        fprintf(stderr, "%s: --wait takes a number of seconds\n", kTool);
        return kExitUsage;
      }
    } else if (a == "--chunk") {
      if (!parse_bytes(next(), 4096, kMaxRecord, &o->chunk)) {
        fprintf(stderr, "%s: --chunk takes 4k..16m\n", kTool);
        return kExitUsage;
      }
    } else if (a.size() > 1 && a[0] == '-' && a != "-") {
      fprintf(stderr, "%s: unknown option %s\n", kTool, a.c_str());
      usage(stderr);
      return kExitUsage;
    } else if (target.empty()) {
      target = a;
    } else if (!have_file) {
      o->file = a;
      have_file = true;
    } else {
      fprintf(stderr, "%s: too many arguments (%s)\n", kTool, a.c_str());
      usage(stderr);
      return kExitUsage;
    }
  }
  if (target.empty()) {
    fprintf(stderr, "%s: missing HOST[:PORT]\n", kTool);
    usage(stderr);
    return kExitUsage;
  }
  if (!parse_endpoint(target, "", false, &o->target) || o->target.port == 0) {
    fprintf(stderr, "%s: bad destination %s (expected HOST[:PORT])\n", kTool, target.c_str());
    return kExitUsage;
  }
  return -1;
}

[[noreturn]] void die() {
  fflush(stdout);
  fflush(stderr);
  _exit(kExitFailed);
}

// Reads the input into slots; computes the checksum as it goes.
struct Reader {
  int fd = 0;
  bool regular = false;
  bool verify = false;
  uint64_t corrupt_at = ~uint64_t{0};
  SlotPool* pool = nullptr;
  Xxh64 hash;
  uint64_t digest = 0;  // valid once the last slot was queued

  // More input right now, without blocking? (pipes, terminals, sockets)
  bool more_ready() const {
    pollfd p{fd, POLLIN, 0};
    return poll(&p, 1, 0) > 0;
  }

  void run() {
    uint64_t offset = 0;
    for (;;) {
      Slot* s = pool->get_empty();
      if (!s) return;
      size_t cap = pool->capacity();
      int err = 0;
      bool eof = false;
      while (s->len < cap) {
        ssize_t n = read(fd, s->data + s->len, cap - s->len);
        if (n > 0) {
          s->len += static_cast<size_t>(n);
          // A pipe that has nothing more right now: send what we have, so an
          // interactive stream is not held back; a file fills the slot.
          if (!regular && s->len < cap && !more_ready()) break;
          continue;
        }
        if (n == 0) {
          eof = true;
          break;
        }
        if (errno == EINTR) continue;
        err = errno;
        break;
      }
      if (s->len > 0) {
        if (verify) hash.update(s->data, s->len);
        if (corrupt_at >= offset && corrupt_at < offset + s->len) s->data[corrupt_at - offset] ^= 0x01;
        offset += s->len;
      }
      if (eof || err) {
        digest = hash.digest();
        if (s->len > 0) {
          pool->put_full(s);
          s = pool->get_empty();
          if (!s) return;
        }
        s->last = true;
        s->error = err;
        pool->put_full(s);
        return;
      }
      pool->put_full(s);
    }
  }
};

Stream connect_with_retry(const Options& o) {
  uint64_t give_up = now_ns() + o.wait_s * 1000000000ull;
  bool said = false;
  for (;;) {
    int err = 0;
    Stream s = Stream::connect(o.target.host.c_str(), o.target.port, &err);
    if (s) return s;
    bool retry = (err == -ECONNREFUSED || err == -ECONNRESET) && now_ns() < give_up;
    if (!retry) {
      fprintf(stderr, "%s: cannot connect to %s: %s\n", kTool, o.target.text().c_str(),
              err == -EHOSTUNREACH ? "unknown host or no route" : strerror(-err));
      die();
    }
    if (o.verbose && !said)
      fprintf(stderr, "%s: %s refused the connection; retrying for up to %" PRIu64 " s\n", kTool,
              o.target.text().c_str(), o.wait_s);
    said = true;
    usleep(50 * 1000);
  }
}

// The receiver's verdict, when the transfer broke off early (the receiver
// replies before it closes, e.g. when its stdout was closed).
bool explain_from_reply(Stream& s, uint64_t sent) {
  set_recv_timeout(s.fd(), 1000);
  Reply r{};
  int err = 0;
  if (recv_exact(s, &r, sizeof r, &err) != sizeof r || !valid(r) || r.status == kOk) return false;
  fprintf(stderr, "%s: rdma_recv stopped the transfer: %s", kTool, status_text(static_cast<ReplyStatus>(r.status)));
  if (r.status == kOutputFailed && r.error) fprintf(stderr, " (%s)", strerror(static_cast<int>(r.error)));
  fprintf(stderr, " after writing %" PRIu64 " bytes (%" PRIu64 " sent)\n", r.bytes, sent);
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (int rc = parse(argc, argv, &o); rc >= 0) return rc;
  signal(SIGPIPE, SIG_IGN);
  // The core reads its settings from the environment, once, at its first call.
  if (!o.transport.empty()) setenv("RDMASHIM_TRANSPORT", o.transport.c_str(), 1);

  Reader reader;
  std::string input_name = "stdin";
  if (!o.file.empty() && o.file != "-") {
    reader.fd = open(o.file.c_str(), O_RDONLY | O_CLOEXEC);
    if (reader.fd < 0) {
      fprintf(stderr, "%s: cannot open %s: %s\n", kTool, o.file.c_str(), strerror(errno));
      return kExitFailed;
    }
    input_name = o.file;
  }
  struct stat st{};
  uint64_t size = kUnknownSize;
  if (fstat(reader.fd, &st) == 0 && S_ISREG(st.st_mode)) {
    reader.regular = true;
    if (st.st_size > 0) size = static_cast<uint64_t>(st.st_size);
    posix_fadvise(reader.fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  } else if (S_ISDIR(st.st_mode)) {
    fprintf(stderr, "%s: %s is a directory\n", kTool, input_name.c_str());
    return kExitFailed;
  }
  grow_pipe(reader.fd);

  Stream s = connect_with_retry(o);
  set_keepalive(s.fd());

  // We speak first (a Header), the receiver answers (a Greeting) before any
  // payload moves.
  uint16_t flags = static_cast<uint16_t>((o.verify ? kHasChecksum : 0) | (size != kUnknownSize ? kSizeKnown : 0));
  Header h = make_header(flags, size);
  int err = 0;
  if (send_exact(s, &h, sizeof h, &err) != sizeof h) {
    fprintf(stderr, "%s: connection to %s lost before sending: %s\n", kTool, o.target.text().c_str(), strerror(err));
    die();
  }
  set_recv_timeout(s.fd(), static_cast<int>(o.greet_timeout_s * 1000));
  Greeting g{};
  size_t got = recv_exact(s, &g, sizeof g, &err);
  if (got != sizeof g || !valid(g)) {
    if (got == sizeof g)
      fprintf(stderr, "%s: %s is not rdma_recv (or speaks another version of it)\n", kTool, o.target.text().c_str());
    else if (err == EAGAIN || err == EWOULDBLOCK)
      fprintf(stderr, "%s: no answer from %s within %" PRIu64 " s: is rdma_recv listening there?\n", kTool,
              o.target.text().c_str(), o.greet_timeout_s);
    else
      fprintf(stderr, "%s: %s closed the connection before answering (%s): not rdma_recv, or busy with another "
              "transfer?\n", kTool, o.target.text().c_str(), err ? strerror(err) : "end of stream");
    die();
  }
  set_recv_timeout(s.fd(), 0);
  bool verify = o.verify || (g.flags & kWantChecksum);
  const char* transport = s.transport();
  if (o.verbose) fprintf(stderr, "%s: connected to %s over %s\n", kTool, o.target.text().c_str(), transport);
  if (!transport_matches(o.transport, transport))
    fprintf(stderr, "%s: warning: asked for transport %s, using %s\n", kTool, o.transport.c_str(), transport);

  SlotPool pool(o.buffers, o.chunk, sizeof(Record));
  if (!pool.ok()) {
    fprintf(stderr, "%s: cannot allocate %" PRIu64 " buffers of %" PRIu64 " bytes\n", kTool, o.buffers, o.chunk);
    die();
  }
  reader.pool = &pool;
  reader.verify = verify;
  reader.corrupt_at = test_corrupt_offset();
  uint64_t start = now_ns();
  std::thread read_thread([&] { reader.run(); });

  std::atomic<uint64_t> sent{0};
  Progress progress(kTool, sent, o.progress);
  progress.start(size, start);
  uint64_t pos = 0;
  for (;;) {
    Slot* slot = pool.get_full();
    if (slot->last) {
      if (slot->error) {
        progress.stop();
        fprintf(stderr, "%s: reading %s failed after %" PRIu64 " bytes: %s\n", kTool, input_name.c_str(), pos,
                strerror(slot->error));
        die();  // no trailer: rdma_recv reports a short stream and fails too
      }
      break;
    }
    Record r{kRecordData, static_cast<uint32_t>(slot->len), pos};
    char* wire = slot->data - sizeof r;
    memcpy(wire, &r, sizeof r);
    size_t want = slot->len + sizeof r;
    if (send_exact(s, wire, want, &err) != want) {
      progress.stop();
      if (!explain_from_reply(s, pos))
        fprintf(stderr, "%s: connection to rdma_recv lost after %" PRIu64 " bytes: %s\n", kTool, pos,
                strerror(err));
      die();
    }
    pos += slot->len;
    sent.store(pos, std::memory_order_relaxed);
    pool.put_empty(slot);
  }
  read_thread.join();
  if (size != kUnknownSize && pos != size)
    fprintf(stderr, "%s: warning: %s changed size while being sent (%" PRIu64 " bytes at the start, %" PRIu64
            " sent)\n", kTool, input_name.c_str(), size, pos);

  Trailer t = make_trailer(pos, verify, reader.digest);
  if (send_exact(s, &t, sizeof t, &err) != sizeof t) {
    progress.stop();
    if (!explain_from_reply(s, pos))
      fprintf(stderr, "%s: connection to rdma_recv lost at the end of the stream: %s\n", kTool, strerror(err));
    die();
  }

  // Wait for the receiver's verdict: it comes once every byte was written out.
  Reply reply{};
  got = recv_exact(s, &reply, sizeof reply, &err);
  uint64_t end = now_ns();
  progress.stop();
  if (got != sizeof reply) {
    fprintf(stderr, "%s: rdma_recv closed the connection before confirming the transfer (%" PRIu64 " bytes sent%s%s)\n",
            kTool, pos, err ? ": " : "", err ? strerror(err) : "");
    die();
  }
  if (!valid(reply)) {
    fprintf(stderr, "%s: malformed reply from rdma_recv\n", kTool);
    die();
  }
  if (reply.status != kOk) {
    fprintf(stderr, "%s: rdma_recv reports %s", kTool, status_text(static_cast<ReplyStatus>(reply.status)));
    if (reply.status == kOutputFailed && reply.error) fprintf(stderr, " (%s)", strerror(static_cast<int>(reply.error)));
    fprintf(stderr, ": %" PRIu64 " bytes sent, %" PRIu64 " written by rdma_recv\n", pos, reply.bytes);
    die();
  }
  if (reply.bytes != pos || (verify && reply.checksum != reader.digest)) {
    fprintf(stderr, "%s: rdma_recv confirmed %" PRIu64 " bytes (xxh64 %016" PRIx64 ") but %" PRIu64
            " were sent (xxh64 %016" PRIx64 ")\n", kTool, reply.bytes, reply.checksum, pos, reader.digest);
    die();
  }

  double seconds = static_cast<double>(end - start) / 1e9;
  if (o.verbose)
    fprintf(stderr, "%s: sent %" PRIu64 " bytes in %.3f s (%.2f GB/s) over %s%s\n", kTool, pos, seconds,
            seconds > 0 ? static_cast<double>(pos) / seconds / 1e9 : 0.0, transport,
            verify ? ", checksum verified" : "");
  if (o.json) printf("%s\n", json_summary(kTool, pos, seconds, transport, verify, reader.digest).c_str());
  fflush(stdout);
  return kExitOk;
}
