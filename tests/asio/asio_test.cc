// Boost.Asio under rdmashim: an asynchronous echo server and its clients in
// one process, driven by an io_context that four threads run. Nothing in it
// knows about rdmashim; run_asio.sh runs it plainly and under `rdmashim run`
// and compares what rdmashim reported with the connection count printed here.
//
// Scenarios (each bounded; the whole program has a watchdog):
//   echo_many     64 connections open at once (each client and each server
//                 session on its own strand), then messages from 1 byte to
//                 4 MiB each way, written and read concurrently, content
//                 checked; then a half-close and EOF from the server
//   lines         2000 small lines in one write, read back with async_read_until
//   timers        200 steady_timers on the pool (none early, all fire); a
//                 cancelled timer reports operation_aborted; a timer-paced
//                 ping-pong on a connection
//   cancellation  a pending async_read cancelled by a timer (socket.cancel())
//                 reports operation_aborted and the connection still works; a
//                 pending async_read ended by close(); a read that beats its
//                 deadline timer; an async_write stuck on a full ring/window
//                 (peer not reading) cancelled, and the peer then receives
//                 exactly the bytes the write reported
//   strands       handlers posted from several threads to 8 strands never
//                 overlap and all run
//
// Prints "asio_test: connections=N" (client connections it made) and exits 0
// when every check passed. A step that does not complete in time is reported
// as a hang (with what the scenario got done) and ends the program with 1.
//
// Options: --connect async|native (async_connect, the default, or a blocking
// ::connect outside asio and socket.assign()), --connections N (64),
// --only a,b (scenarios by name), --repeat N, --watchdog SECONDS (120).
#include <utility>  // before asio: boost 1.74 awaitable.hpp uses std::exchange

#include <boost/asio.hpp>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <sys/socket.h>
#include <unistd.h>

namespace asio = boost::asio;
using asio::ip::tcp;
using boost::system::error_code;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

std::atomic<int> g_failures{0};
std::atomic<int> g_client_connections{0};

void fail_at(const char* file, int line, const std::string& what) {
  g_failures.fetch_add(1);
  fprintf(stderr, "asio_test: CHECK failed at %s:%d: %s\n", file, line, what.c_str());
}

#define CHECK(cond)                                    \
  do {                                                 \
    if (!(cond)) fail_at(__FILE__, __LINE__, #cond);   \
  } while (0)
#define CHECK_MSG(cond, msg)                                                         \
  do {                                                                               \
    if (!(cond)) fail_at(__FILE__, __LINE__, std::string(#cond) + ": " + (msg));     \
  } while (0)
// An error_code that must be success.
#define CHECK_OK(ec) CHECK_MSG(!(ec), (ec).message())

// Detects two handlers of one strand running at the same time.
struct Exclusive {
  std::atomic<int> inside{0};
};
struct ExclusiveScope {
  Exclusive& e;
  explicit ExclusiveScope(Exclusive& x) : e(x) {
    if (e.inside.fetch_add(1) != 0) fail_at(__FILE__, __LINE__, "two handlers of one strand ran concurrently");
  }
  ~ExclusiveScope() { e.inside.fetch_sub(1); }
};

// Deterministic content per (connection, message).
std::vector<uint8_t> pattern(size_t n, uint64_t seed) {
  std::vector<uint8_t> v(n);
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 0x632BE59BD9B4E019ull;
  for (size_t i = 0; i < n; ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    v[i] = static_cast<uint8_t>(x >> 24);
  }
  return v;
}

// A step that did not complete in time is a hang: report it and end the
// program at once (handlers still pending refer to the waiting frame).
std::function<std::string()> g_progress;  // what the running scenario got done, for a hang report

[[noreturn]] void hang(const std::string& what) {
  fprintf(stderr, "asio_test: FAIL: %s did not complete in time (hang)%s%s\n", what.c_str(),
          g_progress ? ": " : "", g_progress ? g_progress().c_str() : "");
  printf("asio_test: connections=%d\n", g_client_connections.load());
  printf("asio_test: FAIL: hang in %s\n", what.c_str());
  fflush(stdout);
  fflush(stderr);
  _exit(1);
}

template <typename Future>
void await(Future& f, std::chrono::seconds limit, const std::string& what) {
  if (f.wait_for(limit) != std::future_status::ready) hang(what);
}

// Runs fn on an executor (a strand) and waits until it ran, bounded.
template <typename Executor, typename Fn>
void sync_on(const Executor& ex, Fn fn, const std::string& what) {
  std::promise<void> ran;
  auto f = ran.get_future();
  asio::post(ex, [&] {
    fn();
    ran.set_value();
  });
  await(f, 10s, what);
}

// Waits for a scenario's completion, bounded.
bool wait_done(std::future<void>& f, const char* scenario, std::chrono::seconds limit = 30s) {
  await(f, limit, std::string("scenario ") + scenario);
  g_progress = nullptr;
  return true;
}

// ---------------------------------------------------------------------------
// The echo server: an acceptor on its own strand, one strand per session.

class EchoServer {
 public:
  explicit EchoServer(asio::io_context& io) : io_(io), acceptor_(asio::make_strand(io)) {
    tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.set_option(tcp::acceptor::reuse_address(true));
    acceptor_.bind(ep);
    acceptor_.listen(512);
    port_ = acceptor_.local_endpoint().port();
    accept();
  }
  uint16_t port() const { return port_; }
  void stop() {
    sync_on(acceptor_.get_executor(), [this] { acceptor_.close(); }, "server stop");
  }

  std::atomic<int> accepted{0};
  std::atomic<int> ended_eof{0};    // sessions that saw the client's EOF and finished cleanly
  std::atomic<int> ended_other{0};  // sessions that ended otherwise (reset, ...)
  std::atomic<uint64_t> echoed{0};

 private:
  class Session : public std::enable_shared_from_this<Session> {
   public:
    Session(tcp::socket s, EchoServer* srv) : sock_(std::move(s)), srv_(srv), buf_(256 * 1024) {}
    void start() {
      error_code ec;
      sock_.set_option(tcp::no_delay(true), ec);
      read();
    }

   private:
    void read() {
      auto self = shared_from_this();
      sock_.async_read_some(asio::buffer(buf_), [this, self](error_code ec, size_t n) {
        ExclusiveScope g(ex_);
        if (ec == asio::error::eof) {
          error_code ignored;
          sock_.shutdown(tcp::socket::shutdown_send, ignored);
          srv_->ended_eof.fetch_add(1);
          return;
        }
        if (ec) {
          srv_->ended_other.fetch_add(1);
          return;
        }
        asio::async_write(sock_, asio::buffer(buf_.data(), n), [this, self](error_code ec, size_t n) {
          ExclusiveScope g(ex_);
          if (ec) {
            srv_->ended_other.fetch_add(1);
            return;
          }
          srv_->echoed.fetch_add(n);
          read();
        });
      });
    }
    tcp::socket sock_;
    EchoServer* srv_;
    std::vector<uint8_t> buf_;
    Exclusive ex_;
  };

  void accept() {
    acceptor_.async_accept(asio::make_strand(io_), [this](error_code ec, tcp::socket s) {
      if (ec) {
        if (ec != asio::error::operation_aborted) fail_at(__FILE__, __LINE__, "accept: " + ec.message());
        return;
      }
      accepted.fetch_add(1);
      std::make_shared<Session>(std::move(s), this)->start();
      accept();
    });
  }

  asio::io_context& io_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
};

// How clients connect. async (the default): async_connect, so the socket is
// in asio's epoll set before connect() is called. native: a blocking
// ::connect() outside asio, then socket.assign(): the socket joins the epoll
// set only once connected.
bool g_native_connect = false;

// Connects `sock` to 127.0.0.1:port and counts the connection; `then(ec)`
// runs on the socket's executor.
template <typename Then>
void connect_counted(tcp::socket& sock, uint16_t port, Then then) {
  tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), port);
  auto connected = [&sock](error_code ec) {
    if (!ec) {
      g_client_connections.fetch_add(1);
      error_code ignored;
      sock.set_option(tcp::no_delay(true), ignored);
    }
  };
  if (!g_native_connect) {
    sock.async_connect(ep, [connected, then = std::move(then)](error_code ec) mutable {
      connected(ec);
      then(ec);
    });
    return;
  }
  error_code ec;
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0 || ::connect(fd, ep.data(), static_cast<socklen_t>(ep.size())) != 0) {
    ec = error_code(errno, asio::error::get_system_category());
    if (fd >= 0) ::close(fd);
  } else {
    sock.assign(tcp::v4(), fd, ec);
  }
  connected(ec);
  asio::post(sock.get_executor(), [ec, then = std::move(then)]() mutable { then(ec); });
}

// ---------------------------------------------------------------------------
// echo_many

class ManyClient : public std::enable_shared_from_this<ManyClient> {
 public:
  struct Shared {
    int total = 0;
    std::atomic<int> phase1{0};
    std::atomic<int> done{0};
    std::vector<std::shared_ptr<ManyClient>> clients;
    std::promise<void> finished;
    std::atomic<uint64_t> bytes{0};
  };

  ManyClient(asio::io_context& io, int id, Shared* sh) : strand_(asio::make_strand(io)), sock_(strand_), id_(id), sh_(sh) {
    sizes_ = {1, 2, 3, 10, 100, 1000, 1460, 4096, 65535, 65536, 200000, (1u << 20) + 13};
    if (id % 16 == 0) sizes_.push_back((4u << 20) + 1);  // bigger than the ring
  }

  void start(uint16_t port) {
    auto self = shared_from_this();
    connect_counted(sock_, port, [this, self](error_code ec) {
      ExclusiveScope g(ex_);
      if (ec) return finish_with("connect: " + ec.message());
      // Phase 1: one small exchange, then wait until every client got here,
      // so all connections are open (and upgraded) at the same time.
      exchange(32, 0xA000 + id_, [this, self] {
        if (sh_->phase1.fetch_add(1) + 1 == sh_->total) {
          for (auto& c : sh_->clients) asio::post(c->strand_, [c] { c->next_message(); });
        }
      });
    });
  }

 private:
  // Writes n bytes and reads the echo concurrently; checks it; then `then`.
  template <typename Then>
  void exchange(size_t n, uint64_t seed, Then then) {
    auto self = shared_from_this();
    out_ = pattern(n, seed);
    in_.assign(n, 0);
    pending_ = 2;
    auto join = [this, self, then](error_code ec, const char* what) {
      ExclusiveScope g(ex_);
      if (ec && !failed_) {
        failed_ = true;
        finish_with(std::string(what) + ": " + ec.message());
      }
      if (--pending_ > 0 || failed_) return;
      if (in_ != out_) {
        size_t at = 0;
        while (at < in_.size() && in_[at] == out_[at]) ++at;
        failed_ = true;
        return finish_with("echo mismatch in a " + std::to_string(out_.size()) + "-byte message at byte " +
                           std::to_string(at));
      }
      sh_->bytes.fetch_add(out_.size());
      then();
    };
    progress_out_ = 0;
    progress_in_ = 0;
    asio::async_write(sock_, asio::buffer(out_), [this, join](error_code ec, size_t n) {
      progress_out_ = n;
      join(ec, "write");
    });
    asio::async_read(sock_, asio::buffer(in_), [this, join](error_code ec, size_t n) {
      progress_in_ = n;
      join(ec, "read");
    });
  }

  void next_message() {
    if (next_ >= sizes_.size()) return half_close();
    size_t n = sizes_[next_];
    uint64_t seed = (static_cast<uint64_t>(id_) << 32) | next_;
    ++next_;
    stage_.store(static_cast<int>(next_));
    auto self = shared_from_this();
    exchange(n, seed, [this, self] { next_message(); });
  }

  void half_close() {
    stage_.store(-2);
    error_code ec;
    sock_.shutdown(tcp::socket::shutdown_send, ec);
    if (ec) return finish_with("shutdown: " + ec.message());
    auto self = shared_from_this();
    in_.assign(1, 0);
    sock_.async_read_some(asio::buffer(in_), [this, self](error_code ec, size_t n) {
      ExclusiveScope g(ex_);
      if (ec != asio::error::eof) return finish_with("expected EOF after half-close, got " + ec.message());
      finish_with("");
    });
  }

  void finish_with(const std::string& error) {
    stage_.store(-3);
    if (!error.empty()) fail_at(__FILE__, __LINE__, "echo_many client " + std::to_string(id_) + ": " + error);
    error_code ignored;
    sock_.close(ignored);
    if (sh_->done.fetch_add(1) + 1 == sh_->total) sh_->finished.set_value();
  }

  asio::strand<asio::io_context::executor_type> strand_;
  tcp::socket sock_;
  int id_;
  Shared* sh_;
  std::vector<size_t> sizes_;
  size_t next_ = 0;
  std::atomic<size_t> progress_in_{0}, progress_out_{0};

 public:
  // For a hang report: 0 connecting/first exchange, k: message k of the
  // list, -2 waiting for EOF after the half-close, -3 finished.
  std::atomic<int> stage_{0};
  bool stuck() const {
    int st = stage_.load();
    return st != -3 && !(st == 0 && progress_in_.load() == 32);  // a finished first exchange waits for the others
  }
  std::string describe() const {
    return "client " + std::to_string(id_) + " at stage " + std::to_string(stage_.load()) +
           " (message of " + std::to_string(stage_ > 0 ? sizes_[stage_ - 1] : 0) + " bytes: " +
           std::to_string(progress_out_.load()) + " written, " + std::to_string(progress_in_.load()) + " read)";
  }

 private:
  std::vector<uint8_t> out_, in_;
  int pending_ = 0;
  bool failed_ = false;
  Exclusive ex_;
};

void scenario_echo_many(asio::io_context& io, EchoServer& server, int n) {
  ManyClient::Shared sh;
  sh.total = n;
  for (int i = 0; i < n; ++i) sh.clients.push_back(std::make_shared<ManyClient>(io, i, &sh));
  auto f = sh.finished.get_future();
  auto t0 = Clock::now();
  int connected_before = g_client_connections.load();
  g_progress = [&] {
    return std::to_string(g_client_connections.load() - connected_before) + " of " + std::to_string(n) +
           " async_connects completed, " + std::to_string(server.accepted.load()) + " accepted, " +
           std::to_string(sh.phase1.load()) + " first exchanges done, " + std::to_string(sh.done.load()) +
           " clients finished; unfinished: " + [&] {
             std::string r;
             for (auto& c : sh.clients)
               if (c->stuck()) r += c->describe() + "; ";
             return r;
           }();
  };
  for (auto& c : sh.clients) c->start(server.port());
  if (!wait_done(f, "echo_many", 60s)) return;
  g_progress = nullptr;
  double s = std::chrono::duration<double>(Clock::now() - t0).count();
  printf("asio_test: echo_many: %d connections, %.1f MiB echoed each way in %.2f s\n", n,
         static_cast<double>(sh.bytes.load()) / (1 << 20), s);
  sh.clients.clear();
}

// ---------------------------------------------------------------------------
// lines: many small messages in one write, read back line by line.

void scenario_lines(asio::io_context& io, EchoServer& server) {
  struct State {
    explicit State(asio::io_context& io) : strand(asio::make_strand(io)), sock(strand) {}
    asio::strand<asio::io_context::executor_type> strand;
    tcp::socket sock;
    std::string out;
    asio::streambuf in;
    int next = 0;
    std::promise<void> done;
  };
  const int kLines = 2000;
  auto st = std::make_shared<State>(io);
  for (int i = 0; i < kLines; ++i) st->out += "line " + std::to_string(i) + std::string(i % 37, 'x') + "\n";
  auto f = st->done.get_future();
  connect_counted(st->sock, server.port(), [st](error_code ec) {
    if (ec) {
      fail_at(__FILE__, __LINE__, "lines: connect: " + ec.message());
      return st->done.set_value();
    }
    asio::async_write(st->sock, asio::buffer(st->out), [st](error_code ec, size_t) {
      if (ec) fail_at(__FILE__, __LINE__, "lines: write: " + ec.message());
    });
    auto read_line = std::make_shared<std::function<void()>>();
    *read_line = [st, read_line, kLines] {
      asio::async_read_until(st->sock, st->in, '\n', [st, read_line, kLines](error_code ec, size_t n) {
        if (ec) {
          fail_at(__FILE__, __LINE__, "lines: read: " + ec.message());
          *read_line = nullptr;
          return st->done.set_value();
        }
        std::string line(asio::buffers_begin(st->in.data()), asio::buffers_begin(st->in.data()) + n);
        st->in.consume(n);
        std::string want = "line " + std::to_string(st->next) + std::string(st->next % 37, 'x') + "\n";
        if (line != want) {
          fail_at(__FILE__, __LINE__, "lines: line " + std::to_string(st->next) + " differs: " + line);
          *read_line = nullptr;
          return st->done.set_value();
        }
        if (++st->next == kLines) {
          error_code ignored;
          st->sock.close(ignored);
          *read_line = nullptr;
          return st->done.set_value();
        }
        (*read_line)();
      });
    };
    (*read_line)();
  });
  g_progress = [st] { return std::to_string(st->next) + " of 2000 lines read back"; };
  if (wait_done(f, "lines")) printf("asio_test: lines: %d lines echoed and checked\n", st->next);
}

// ---------------------------------------------------------------------------
// timers

void scenario_timers(asio::io_context& io, EchoServer& server) {
  // 200 timers with expiries from 1 to 100 ms: none early, all fire.
  {
    const int kTimers = 200;
    std::atomic<int> fired{0}, early{0};
    std::promise<void> all;
    auto f = all.get_future();
    std::vector<std::unique_ptr<asio::steady_timer>> timers;
    auto start = Clock::now();
    for (int i = 0; i < kTimers; ++i) {
      auto expiry = start + std::chrono::milliseconds(1 + (i * 37) % 100);
      timers.push_back(std::make_unique<asio::steady_timer>(asio::make_strand(io), expiry));
      timers.back()->async_wait([&, expiry](error_code ec) {
        CHECK_OK(ec);
        if (Clock::now() < expiry) early.fetch_add(1);
        if (fired.fetch_add(1) + 1 == kTimers) all.set_value();
      });
    }
    if (wait_done(f, "timers", 10s)) {
      CHECK(early.load() == 0);
      printf("asio_test: timers: %d fired, %d early, last after %.1f ms\n", fired.load(), early.load(),
             std::chrono::duration<double, std::milli>(Clock::now() - start).count());
    }
  }
  // A 10 s timer cancelled after 20 ms by another timer: operation_aborted, promptly.
  {
    asio::steady_timer long_timer(io, 10s), canceller(io, 20ms);
    std::promise<error_code> got;
    std::promise<void> cancelled;
    auto f = got.get_future();
    auto fc = cancelled.get_future();
    auto start = Clock::now();
    long_timer.async_wait([&](error_code ec) { got.set_value(ec); });
    canceller.async_wait([&](error_code ec) {
      long_timer.cancel();
      cancelled.set_value();
    });
    await(fc, 5s, "timers: the cancelling timer");
    await(f, 5s, "timers: a cancelled timer");
    error_code ec = f.get();
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    CHECK_MSG(ec == asio::error::operation_aborted, ec.message());
    CHECK(ms >= 19 && ms < 4000);
    printf("asio_test: timers: 10 s timer cancelled after %.1f ms: %s\n", ms, ec.message().c_str());
  }
  // A timer-paced ping-pong: every 5 ms one 8-byte message, 50 rounds.
  {
    struct State {
      explicit State(asio::io_context& io) : strand(asio::make_strand(io)), sock(strand), timer(strand) {}
      asio::strand<asio::io_context::executor_type> strand;
      tcp::socket sock;
      asio::steady_timer timer;
      uint64_t round = 0, out = 0, in = 0;
      Clock::time_point start;
      std::promise<void> done;
      std::function<void()> tick;
    };
    const uint64_t kRounds = 50;
    auto st = std::make_shared<State>(io);
    auto f = st->done.get_future();
    auto end = [st](const std::string& error) {
      if (!error.empty()) fail_at(__FILE__, __LINE__, "paced: " + error);
      error_code ignored;
      st->sock.close(ignored);
      st->tick = nullptr;
      st->done.set_value();
    };
    st->tick = [st, end, kRounds] {
      st->timer.expires_after(5ms);
      st->timer.async_wait([st, end, kRounds](error_code ec) {
        if (ec) return end("timer: " + ec.message());
        st->out = 0x7061636564000000ull + st->round;
        asio::async_write(st->sock, asio::buffer(&st->out, 8), [st, end](error_code ec, size_t) {
          if (ec) return end("write: " + ec.message());
          asio::async_read(st->sock, asio::buffer(&st->in, 8), [st, end](error_code ec, size_t) {
            if (ec) return end("read: " + ec.message());
            if (st->in != st->out) return end("echo mismatch");
            if (++st->round == 50) return end("");
            st->tick();
          });
        });
      });
    };
    connect_counted(st->sock, server.port(), [st, end](error_code ec) {
      if (ec) return end("connect: " + ec.message());
      st->start = Clock::now();
      st->tick();
    });
    g_progress = [st] { return std::to_string(st->round) + " of 50 rounds done"; };
    if (wait_done(f, "paced ping-pong", 20s)) {
      double ms = std::chrono::duration<double, std::milli>(Clock::now() - st->start).count();
      CHECK(st->round == kRounds);
      CHECK(ms >= 5.0 * kRounds);
      printf("asio_test: timers: paced ping-pong, %llu rounds in %.1f ms\n",
             static_cast<unsigned long long>(st->round), ms);
    }
  }
}

// ---------------------------------------------------------------------------
// cancellation

// A server whose sessions echo their first 16 bytes, then stop reading until
// released, then count everything until EOF: a writer to it fills the ring
// (or the TCP window) and blocks.
class SinkServer {
 public:
  explicit SinkServer(asio::io_context& io) : io_(io), acceptor_(asio::make_strand(io)) {
    tcp::endpoint ep(asio::ip::make_address("127.0.0.1"), 0);
    acceptor_.open(ep.protocol());
    acceptor_.bind(ep);
    acceptor_.listen(16);
    port_ = acceptor_.local_endpoint().port();
  }
  uint16_t port() const { return port_; }

  struct Session {
    explicit Session(tcp::socket s) : sock(std::move(s)), hold(sock.get_executor(), Clock::time_point::max()) {}
    tcp::socket sock;
    asio::steady_timer hold;
    uint8_t first[16];
    std::vector<uint8_t> buf = std::vector<uint8_t>(256 * 1024);
    uint64_t drained = 0;
    std::promise<uint64_t> total;  // bytes after the first 16, at EOF
    std::function<void()> drain;
  };

  // Accepts one session; `echoed` is set once its first 16 bytes went back.
  std::shared_ptr<Session> accept_one(std::promise<void>* echoed) {
    std::promise<std::shared_ptr<Session>> got;
    auto f = got.get_future();
    acceptor_.async_accept(asio::make_strand(io_), [&got, echoed](error_code ec, tcp::socket s) {
      if (ec) {
        fail_at(__FILE__, __LINE__, "sink accept: " + ec.message());
        got.set_value(nullptr);
        echoed->set_value();
        return;
      }
      auto ss = std::make_shared<Session>(std::move(s));
      got.set_value(ss);
      asio::async_read(ss->sock, asio::buffer(ss->first), [ss, echoed](error_code ec, size_t) {
        if (ec) {
          fail_at(__FILE__, __LINE__, "sink read: " + ec.message());
          return echoed->set_value();
        }
        asio::async_write(ss->sock, asio::buffer(ss->first), [ss, echoed](error_code ec, size_t) {
          CHECK_OK(ec);
          echoed->set_value();
          // Held: no reads until released (the hold timer is cancelled).
          ss->hold.async_wait([ss](error_code) {
            ss->drain = [ss] {
              ss->sock.async_read_some(asio::buffer(ss->buf), [ss](error_code ec, size_t n) {
                ss->drained += n;
                if (ec) {
                  if (ec != asio::error::eof) fail_at(__FILE__, __LINE__, "sink drain: " + ec.message());
                  ss->total.set_value(ss->drained);
                  ss->drain = nullptr;
                  return;
                }
                ss->drain();
              });
            };
            ss->drain();
          });
        });
      });
    });
    return f.get();
  }

 private:
  asio::io_context& io_;
  tcp::acceptor acceptor_;
  uint16_t port_ = 0;
};

// Runs `op` on a fresh connection to the echo server after one checked
// 16-byte exchange (so the connection is past its handshake).
struct Conn {
  explicit Conn(asio::io_context& io) : strand(asio::make_strand(io)), sock(strand), timer(strand) {}
  asio::strand<asio::io_context::executor_type> strand;
  tcp::socket sock;
  asio::steady_timer timer;
  uint8_t out[16], in[16];
};

bool connect_and_exchange(Conn& c, uint16_t port, const char* what) {
  std::promise<error_code> p;
  auto f = p.get_future();
  memcpy(c.out, "0123456789abcdef", 16);
  connect_counted(c.sock, port, [&](error_code ec) {
    if (ec) return p.set_value(ec);
    asio::async_write(c.sock, asio::buffer(c.out), [&](error_code ec, size_t) {
      if (ec) return p.set_value(ec);
      asio::async_read(c.sock, asio::buffer(c.in), [&](error_code ec, size_t) { p.set_value(ec); });
    });
  });
  await(f, 10s, std::string(what) + ": connect and first exchange");
  error_code ec = f.get();
  if (ec) {
    fail_at(__FILE__, __LINE__, std::string(what) + ": connect/exchange: " + ec.message());
    return false;
  }
  if (memcmp(c.in, c.out, 16) != 0) {
    fail_at(__FILE__, __LINE__, std::string(what) + ": first echo differs");
    return false;
  }
  return true;
}

void scenario_cancellation(asio::io_context& io, EchoServer& server) {
  // (a) pending read, cancelled by a timer through socket.cancel(); the
  //     connection then still echoes.
  {
    Conn c(io);
    if (!connect_and_exchange(c, server.port(), "cancel-read")) return;
    std::promise<std::pair<error_code, size_t>> p;
    auto f = p.get_future();
    auto start = Clock::now();
    asio::post(c.strand, [&] {
      asio::async_read(c.sock, asio::buffer(c.in), [&](error_code ec, size_t n) { p.set_value({ec, n}); });
      c.timer.expires_after(50ms);
      c.timer.async_wait([&](error_code ec) {
        if (!ec) c.sock.cancel();
      });
    });
    await(f, 10s, "cancel-read: the cancelled read never completed");
    auto [ec, n] = f.get();
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    CHECK_MSG(ec == asio::error::operation_aborted, ec.message());
    CHECK(n == 0);
    CHECK(ms >= 45);
    printf("asio_test: cancellation: pending async_read cancelled after %.1f ms: %s\n", ms, ec.message().c_str());

    // Still usable: another exchange, checked.
    std::promise<error_code> p2;
    auto f2 = p2.get_future();
    memcpy(c.out, "after-cancel-ok!", 16);
    asio::post(c.strand, [&] {
      asio::async_write(c.sock, asio::buffer(c.out), [&](error_code ec, size_t) {
        if (ec) return p2.set_value(ec);
        asio::async_read(c.sock, asio::buffer(c.in), [&](error_code ec, size_t) { p2.set_value(ec); });
      });
    });
    await(f2, 10s, "cancel-read: exchange after cancel did not finish");
    error_code ec2 = f2.get();
    CHECK_OK(ec2);
    CHECK(memcmp(c.in, "after-cancel-ok!", 16) == 0);

    // (b) pending read ended by close() from a timer.
    std::promise<error_code> p3;
    auto f3 = p3.get_future();
    asio::post(c.strand, [&] {
      asio::async_read(c.sock, asio::buffer(c.in), [&](error_code ec, size_t) { p3.set_value(ec); });
      c.timer.expires_after(30ms);
      c.timer.async_wait([&](error_code ec) {
        error_code ignored;
        if (!ec) c.sock.close(ignored);
      });
    });
    await(f3, 10s, "close-read: the read never completed after close()");
    error_code ec3 = f3.get();
    CHECK_MSG(ec3 == asio::error::operation_aborted, ec3.message());
    printf("asio_test: cancellation: pending async_read ended by close(): %s\n", ec3.message().c_str());
  }
  // (c) the data beats the deadline: the read succeeds, the timer is cancelled.
  {
    Conn c(io);
    if (!connect_and_exchange(c, server.port(), "deadline")) return;
    std::promise<error_code> read_done, timer_done;
    auto fr = read_done.get_future(), ft = timer_done.get_future();
    memcpy(c.out, "beats-the-timer!", 16);
    asio::post(c.strand, [&] {
      c.timer.expires_after(5s);
      c.timer.async_wait([&](error_code ec) {
        if (!ec) c.sock.cancel();
        timer_done.set_value(ec);
      });
      asio::async_read(c.sock, asio::buffer(c.in), [&](error_code ec, size_t) {
        c.timer.cancel();
        read_done.set_value(ec);
      });
      asio::async_write(c.sock, asio::buffer(c.out), [](error_code ec, size_t) { CHECK_OK(ec); });
    });
    await(fr, 10s, "deadline: the read");
    await(ft, 10s, "deadline: the timer");
    error_code er = fr.get(), et = ft.get();
    CHECK_OK(er);
    CHECK(memcmp(c.in, "beats-the-timer!", 16) == 0);
    CHECK_MSG(et == asio::error::operation_aborted, et.message());
    printf("asio_test: cancellation: read beat its 5 s deadline; timer: %s\n", et.message().c_str());
    error_code ignored;
    c.sock.close(ignored);
  }
  // (d) a write stuck because the peer does not read, cancelled; the peer
  //     then receives exactly what the write reported.
  {
    SinkServer sink(io);
    Conn c(io);
    std::promise<void> echoed;
    auto fe = echoed.get_future();
    std::shared_ptr<SinkServer::Session> session;
    std::thread acceptor([&] { session = sink.accept_one(&echoed); });
    bool ok = connect_and_exchange(c, sink.port(), "cancel-write");
    acceptor.join();
    if (!ok || !session) return;
    fe.wait();
    const size_t kBig = 384u << 20;  // more than a ring (kMaxRingSize at most) or a loopback window holds
    std::vector<uint8_t> big = pattern(kBig, 0xB16);
    std::promise<std::pair<error_code, size_t>> p;
    auto f = p.get_future();
    auto start = Clock::now();
    // What the composed write had done when the timer cancelled it.
    std::atomic<size_t> progress{0}, at_cancel{0};
    std::atomic<int64_t> last_step_us{0}, cancel_us{0};
    std::atomic<int> cancels{0};
    auto us_since = [&start] {
      return std::chrono::duration_cast<std::chrono::microseconds>(Clock::now() - start).count();
    };
    // socket.cancel() cancels only an operation waiting in the reactor: one
    // that comes while the composed write is between two of its write_some
    // steps (still filling the ring or window) is lost, and the write then
    // waits for ever on the full ring. So, as a program must with asio's
    // composed operations, cancel again every 20 ms until the write ended.
    bool written = false;  // on the strand
    std::function<void(error_code)> cancel_step = [&](error_code ec) {
      if (ec || written) return;
      if (cancels++ == 0) {
        at_cancel = progress.load();
        cancel_us = us_since();
      }
      c.sock.cancel();
      c.timer.expires_after(20ms);
      c.timer.async_wait(cancel_step);
    };
    asio::post(c.strand, [&] {
      asio::async_write(
          c.sock, asio::buffer(big),
          [&](const error_code& ec, size_t done) -> size_t {  // asio::transfer_all, observed
            progress = done;
            last_step_us = us_since();
            return ec ? 0 : 65536;
          },
          [&](error_code ec, size_t n) {
            written = true;
            c.timer.cancel();
            p.set_value({ec, n});
          });
      c.timer.expires_after(200ms);
      c.timer.async_wait(cancel_step);
    });
    g_progress = [&] {
      return std::to_string(cancels.load()) + " cancel(s), the first at " + std::to_string(cancel_us.load()) +
             " us with " + std::to_string(at_cancel.load()) + " bytes written; now " + std::to_string(progress.load()) + " bytes, last step at " +
             std::to_string(last_step_us.load()) + " us";
    };
    await(f, 10s, "cancel-write: the cancelled write never completed");
    g_progress = nullptr;
    auto [ec, n] = f.get();
    double ms = std::chrono::duration<double, std::milli>(Clock::now() - start).count();
    CHECK_MSG(ec == asio::error::operation_aborted, ec.message());
    CHECK(n > 0 && n < kBig);
    CHECK(ms >= 150);
    // Close our end, release the sink: it must count exactly n bytes, then EOF.
    sync_on(c.strand, [&] {
      error_code ignored;
      c.sock.close(ignored);
    }, "cancel-write: close");
    auto total = session->total.get_future();
    asio::post(session->sock.get_executor(), [session] { session->hold.cancel(); });
    await(total, 10s, "cancel-write: the sink never saw EOF");
    uint64_t got = total.get();
    CHECK_MSG(got == n, std::to_string(got) + " bytes received, " + std::to_string(n) + " reported written");
    printf("asio_test: cancellation: stuck async_write cancelled after %.1f ms (%d cancel(s)) with %zu bytes "
           "written; the peer received %llu\n",
           ms, cancels.load(), n, static_cast<unsigned long long>(got));
    sync_on(session->sock.get_executor(), [session] {
      error_code ignored;
      session->sock.close(ignored);
    }, "cancel-write: sink close");
  }
}

// ---------------------------------------------------------------------------
// strands: handlers posted from several threads never overlap on one strand.

void scenario_strands(asio::io_context& io) {
  const int kStrands = 8, kPosters = 4, kPerPoster = 5000;
  struct Lane {
    explicit Lane(asio::io_context& io) : strand(asio::make_strand(io)) {}
    asio::strand<asio::io_context::executor_type> strand;
    Exclusive ex;
    uint64_t count = 0;  // deliberately not atomic: the strand serializes
  };
  std::vector<std::unique_ptr<Lane>> lanes;
  for (int i = 0; i < kStrands; ++i) lanes.push_back(std::make_unique<Lane>(io));
  std::atomic<int> remaining{kStrands * kPosters * kPerPoster};
  std::promise<void> done;
  auto f = done.get_future();
  std::vector<std::thread> posters;
  for (int t = 0; t < kPosters; ++t) {
    posters.emplace_back([&] {
      for (int i = 0; i < kPerPoster; ++i) {
        for (auto& l : lanes) {
          Lane* lane = l.get();
          asio::post(lane->strand, [lane, &remaining, &done] {
            {
              ExclusiveScope g(lane->ex);
              uint64_t c = lane->count;
              if ((c & 63) == 0) std::this_thread::yield();  // widen the window for an overlap
              lane->count = c + 1;
            }
            if (remaining.fetch_sub(1) == 1) done.set_value();  // the last touch of shared state
          });
        }
      }
    });
  }
  for (auto& p : posters) p.join();
  if (!wait_done(f, "strands", 30s)) return;
  for (auto& l : lanes) CHECK(l->count == static_cast<uint64_t>(kPosters) * kPerPoster);
  printf("asio_test: strands: %d strands x %d handlers on 4 threads, no overlap\n", kStrands, kPosters * kPerPoster);
}

}  // namespace

int main(int argc, char** argv) {
  setvbuf(stdout, nullptr, _IOLBF, 0);
  int connections = 64, repeat = 1, watchdog_s = 120;
  std::string only;
  auto wanted = [&](const char* name) { return only.empty() || ("," + only + ",").find(std::string(",") + name + ",") != std::string::npos; };
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--connections" && i + 1 < argc) {
      connections = atoi(argv[++i]);
    } else if (a == "--only" && i + 1 < argc) {
      only = argv[++i];
    } else if (a == "--watchdog" && i + 1 < argc) {
      watchdog_s = std::max(1, atoi(argv[++i]));
    } else if (a == "--repeat" && i + 1 < argc) {
      repeat = std::max(1, atoi(argv[++i]));
    } else if (a == "--connect" && i + 1 < argc && (std::string(argv[i + 1]) == "async" ||
                                                     std::string(argv[i + 1]) == "native")) {
      g_native_connect = std::string(argv[++i]) == "native";
    } else {
      fprintf(stderr, "usage: asio_test [--connections N (64)] [--connect async|native] [--repeat N]\n"
                      "                 [--only echo_many,lines,timers,cancellation,strands] [--watchdog S (120)]\n");
      return 2;
    }
  }
  if (connections < 1) connections = 64;

  // The whole program is bounded: a hang anywhere is a failure, not a stuck ctest.
  std::atomic<bool> finished{false};
  std::thread watchdog([&] {
    for (int i = 0; i < watchdog_s * 10 && !finished.load(); ++i) std::this_thread::sleep_for(100ms);
    if (!finished.load()) {
      fprintf(stderr, "asio_test: FAIL: watchdog: not finished after %d s\n", watchdog_s);
      fflush(stdout);
      _exit(3);
    }
  });

  asio::io_context io;
  auto guard = asio::make_work_guard(io);
  std::vector<std::thread> pool;
  for (int i = 0; i < 4; ++i) pool.emplace_back([&io] { io.run(); });

  {
    EchoServer server(io);
    for (int r = 0; r < repeat; ++r) {
      if (wanted("echo_many")) scenario_echo_many(io, server, connections);
      if (wanted("lines")) scenario_lines(io, server);
      if (wanted("timers")) scenario_timers(io, server);
      if (wanted("cancellation")) scenario_cancellation(io, server);
      if (wanted("strands")) scenario_strands(io);
      g_progress = nullptr;
    }

    // Every session saw its client's EOF or close, and all were accepted.
    auto deadline = Clock::now() + 10s;
    while (server.ended_eof.load() + server.ended_other.load() < server.accepted.load() && Clock::now() < deadline)
      std::this_thread::sleep_for(10ms);
    printf("asio_test: server: %d accepted, %d ended at EOF, %d otherwise, %.1f MiB echoed\n",
           server.accepted.load(), server.ended_eof.load(), server.ended_other.load(),
           static_cast<double>(server.echoed.load()) / (1 << 20));
    CHECK(server.ended_eof.load() + server.ended_other.load() == server.accepted.load());
    CHECK(server.ended_other.load() == 0);
    // The sink server's connections are counted by the client only.
    CHECK(server.accepted.load() == g_client_connections.load() - (wanted("cancellation") ? repeat : 0));
    server.stop();
    std::this_thread::sleep_for(20ms);  // the aborted accept's handler runs
  }
  guard.reset();
  io.stop();
  for (auto& t : pool) t.join();
  finished.store(true);
  watchdog.join();

  printf("asio_test: connections=%d\n", g_client_connections.load());
  if (g_failures.load() != 0) {
    printf("asio_test: FAIL: %d check(s) failed\n", g_failures.load());
    return 1;
  }
  printf("asio_test: PASS\n");
  return 0;
}
