// One side of the soak (tests/soak/soak.py runs two servers and two clients,
// each with or without rdmashim):
//   soak_peer server --port-file F --stats-file S
//   soak_peer client --ports P1,P2 --conns N --seconds T --seed X --stats-file S [--then-idle 1]
// A client keeps N connections open, each to a random server: it sends a
// header {seed, up_len, down_len}, then up_len bytes of the PRNG stream
// `seed` in random-sized writes, while the server answers down_len bytes of
// stream `seed ^ kDown`. Each side compares every byte it receives with its
// own copy of the stream. Some clients close at a random point instead
// (plain close or RST); then they reconnect. Single-threaded, non-blocking,
// epoll (level-triggered). Every second the process rewrites its stats file
// (one JSON line); it exits 1 if any byte was wrong. With --then-idle, a
// client whose sessions are all done says so in its stats ("idle") and waits
// for SIGTERM, so that soak.py can count what it still holds against what it
// held after one empty session with each server ("start_fds", "start_maps":
// what the first connection loads, such as rdmashim's verbs libraries, is
// in both counts).
#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace {

constexpr uint64_t kDown = 0x9e3779b97f4a7c15ull;

uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// A byte stream from a seed, produced in any chunking.
struct Stream {
  uint64_t state;
  uint64_t word = 0;
  int left = 0;
  explicit Stream(uint64_t seed) : state(seed) {}
  void fill(unsigned char* out, size_t n) {
    for (size_t i = 0; i < n; ++i) {
      if (left == 0) {
        word = splitmix(state);
        left = 8;
      }
      out[i] = static_cast<unsigned char>(word);
      word >>= 8;
      --left;
    }
  }
  // True if `in` is the next n bytes of the stream.
  bool check(const unsigned char* in, size_t n) {
    unsigned char want[65536];
    for (size_t done = 0; done < n;) {
      size_t k = n - done < sizeof want ? n - done : sizeof want;
      fill(want, k);
      if (memcmp(want, in + done, k) != 0) return false;
      done += k;
    }
    return true;
  }
};

uint64_t g_rng = 1;
uint64_t rnd(uint64_t n) { return n ? splitmix(g_rng) % n : 0; }
// Mostly small writes, some large: 1 B .. 256 KiB.
size_t chunk() {
  uint64_t r = rnd(100);
  return 1 + rnd(r < 70 ? 512 : r < 95 ? 16384 : 262144);
}
// Log-uniform 0 .. 4 MiB.
uint64_t length() { return rnd(4) == 0 ? rnd(64) : rnd(uint64_t{1} << (6 + rnd(17))); }

double now_s() {
  timespec ts{};
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) / 1e9;
}

struct Totals {
  uint64_t checked = 0, sent = 0, sessions = 0, completed = 0, aborted = 0, errors = 0, connect_failed = 0;
} g;
std::string g_stats_file;
volatile sig_atomic_t g_stop = 0;
int g_start_fds = -1, g_start_maps = -1;
bool g_idle = false;

// Entries of /proc/self/fd (less the one counting them) or lines of /proc/self/maps.
int count_own(bool maps) {
  int n = 0;
  if (maps) {
    FILE* f = fopen("/proc/self/maps", "r");
    if (!f) return -1;
    for (int ch; (ch = fgetc(f)) != EOF;) n += ch == '\n';
    fclose(f);
    return n;
  }
  DIR* d = opendir("/proc/self/fd");
  if (!d) return -1;
  while (dirent* e = readdir(d)) n += e->d_name[0] != '.';
  closedir(d);
  return n - 1;
}

void write_stats(int live) {
  std::string tmp = g_stats_file + ".tmp";
  FILE* f = fopen(tmp.c_str(), "w");
  if (!f) return;
  fprintf(f,
          "{\"bytes_checked\":%llu,\"bytes_sent\":%llu,\"sessions\":%llu,\"completed\":%llu,\"aborted\":%llu,"
          "\"errors\":%llu,\"connect_failed\":%llu,\"live\":%d,\"idle\":%s,\"start_fds\":%d,"
          "\"start_maps\":%d}\n",
          (unsigned long long)g.checked, (unsigned long long)g.sent, (unsigned long long)g.sessions,
          (unsigned long long)g.completed, (unsigned long long)g.aborted, (unsigned long long)g.errors,
          (unsigned long long)g.connect_failed, live, g_idle ? "true" : "false", g_start_fds, g_start_maps);
  fclose(f);
  rename(tmp.c_str(), g_stats_file.c_str());
}

struct Conn {
  int fd = -1;
  bool client = false;
  unsigned char hdr[24] = {};
  size_t hdr_have = 0;      // server: header bytes read; client: header bytes sent
  uint64_t seed = 0, up_len = 0, down_len = 0;
  uint64_t up_done = 0, down_done = 0;  // bytes sent or checked in each direction
  uint64_t abort_at = UINT64_MAX;       // client: close after this many up bytes
  bool rst = false;
  std::unique_ptr<Stream> up, down;
  std::vector<unsigned char> pending;  // generated, not yet written
  size_t pending_off = 0;
  bool want_out = false;
};

int g_ep = -1;
std::map<int, std::unique_ptr<Conn>> g_conns;

void set_interest(Conn& c, bool out) {
  if (c.want_out == out) return;
  c.want_out = out;
  epoll_event ev{};
  ev.events = EPOLLIN | (out ? uint32_t{EPOLLOUT} : 0u);
  ev.data.fd = c.fd;
  epoll_ctl(g_ep, EPOLL_CTL_MOD, c.fd, &ev);
}

void finish(Conn& c, bool completed, bool error, const char* why) {
  if (error) {
    ++g.errors;
    fprintf(stderr, "soak_peer %s: fd %d seed %llx: %s (up %llu/%llu down %llu/%llu)\n",
            c.client ? "client" : "server", c.fd, (unsigned long long)c.seed, why, (unsigned long long)c.up_done,
            (unsigned long long)c.up_len, (unsigned long long)c.down_done, (unsigned long long)c.down_len);
  } else if (completed) {
    ++g.completed;
  } else {
    ++g.aborted;
  }
  if (c.rst) {
    linger l{1, 0};
    setsockopt(c.fd, SOL_SOCKET, SO_LINGER, &l, sizeof l);
  }
  epoll_ctl(g_ep, EPOLL_CTL_DEL, c.fd, nullptr);
  close(c.fd);
  g_conns.erase(c.fd);  // c is gone
}

bool client_done(const Conn& c);

// Writes what this side owes: the client's header and up stream, the
// server's down stream. Returns false if the connection ended.
bool pump_out(Conn& c) {
  for (;;) {
    if (c.pending_off == c.pending.size()) {
      c.pending.clear();
      c.pending_off = 0;
      if (c.client && c.hdr_have < sizeof c.hdr) {
        c.pending.assign(c.hdr + c.hdr_have, c.hdr + sizeof c.hdr);
        c.hdr_have = sizeof c.hdr;
      } else {
        uint64_t total = c.client ? c.up_len : c.down_len, done = c.client ? c.up_done : c.down_done;
        if (c.client && done >= c.abort_at) {
          finish(c, false, false, "");
          return false;
        }
        if (done == total) {
          if (c.client && client_done(c)) {  // nothing to read either (down_len 0)
            finish(c, true, false, "");
            return false;
          }
          set_interest(c, false);
          return true;
        }
        size_t n = chunk();
        if (n > total - done) n = total - done;
        c.pending.resize(n);
        (c.client ? c.up : c.down)->fill(c.pending.data(), n);
        (c.client ? c.up_done : c.down_done) += n;
      }
    }
    ssize_t w = send(c.fd, c.pending.data() + c.pending_off, c.pending.size() - c.pending_off, MSG_NOSIGNAL);
    if (w < 0 && (errno == EAGAIN || errno == EINTR)) {
      set_interest(c, true);
      return true;
    }
    if (w < 0) {
      // The peer went away: fine only for a server whose client may abort.
      finish(c, false, c.client, strerror(errno));
      return false;
    }
    c.pending_off += static_cast<size_t>(w);
    g.sent += static_cast<uint64_t>(w);
  }
}

bool client_done(const Conn& c) {
  return c.hdr_have == sizeof c.hdr && c.up_done == c.up_len && c.pending_off == c.pending.size() &&
         c.down_done == c.down_len;
}

void on_readable(Conn& c) {
  unsigned char buf[65536];
  for (int rounds = 0; rounds < 16; ++rounds) {
    size_t want = sizeof buf;
    if (!c.client && c.hdr_have < sizeof c.hdr) want = sizeof c.hdr - c.hdr_have;
    ssize_t r = recv(c.fd, buf, want, 0);
    if (r < 0 && (errno == EAGAIN || errno == EINTR)) return;
    if (r <= 0) {
      bool done = c.client ? client_done(c) : c.hdr_have == sizeof c.hdr && c.up_done == c.up_len;
      // EOF before the end: the client aborted (server side), never acceptable for a client.
      finish(c, done, c.client && !done, r < 0 ? strerror(errno) : "eof before the end");
      return;
    }
    size_t n = static_cast<size_t>(r);
    if (!c.client && c.hdr_have < sizeof c.hdr) {
      memcpy(c.hdr + c.hdr_have, buf, n);
      c.hdr_have += n;
      if (c.hdr_have < sizeof c.hdr) continue;
      memcpy(&c.seed, c.hdr, 8);
      memcpy(&c.up_len, c.hdr + 8, 8);
      memcpy(&c.down_len, c.hdr + 16, 8);
      c.up = std::make_unique<Stream>(c.seed);
      c.down = std::make_unique<Stream>(c.seed ^ kDown);
      ++g.sessions;
      if (!pump_out(c)) return;
      continue;
    }
    uint64_t& done = c.client ? c.down_done : c.up_done;
    uint64_t total = c.client ? c.down_len : c.up_len;
    Stream& s = c.client ? *c.down : *c.up;
    if (n > total - done) return finish(c, false, true, "more bytes than announced");
    if (!s.check(buf, n)) return finish(c, false, true, "bytes differ from the stream");
    done += n;
    g.checked += n;
    if (c.client && client_done(c)) return finish(c, true, false, "");
  }
}

void add(std::unique_ptr<Conn> c) {
  epoll_event ev{};
  ev.events = EPOLLIN;
  ev.data.fd = c->fd;
  epoll_ctl(g_ep, EPOLL_CTL_ADD, c->fd, &ev);
  g_conns[c->fd] = std::move(c);
}

// One empty session with each server (header {0, 0, 0}, our FIN, its FIN),
// blocking, before the counts the idle client is held to.
bool warm_up(const std::vector<int>& ports) {
  for (int port : ports) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<uint16_t>(port));
    unsigned char hdr[24] = {}, b[64];
    bool ok = fd >= 0 && connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 &&
              send(fd, hdr, sizeof hdr, MSG_NOSIGNAL) == sizeof hdr && shutdown(fd, SHUT_WR) == 0 &&
              recv(fd, b, sizeof b, 0) == 0;
    if (fd >= 0) close(fd);
    if (!ok) return false;
  }
  return true;
}

bool open_client(const std::vector<int>& ports) {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(static_cast<uint16_t>(ports[rnd(ports.size())]));
  if (connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
    ++g.connect_failed;
    close(fd);
    return false;
  }
  fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
  auto c = std::make_unique<Conn>();
  c->fd = fd;
  c->client = true;
  c->seed = splitmix(g_rng);
  c->up_len = length();
  c->down_len = length();
  memcpy(c->hdr, &c->seed, 8);
  memcpy(c->hdr + 8, &c->up_len, 8);
  memcpy(c->hdr + 16, &c->down_len, 8);
  c->up = std::make_unique<Stream>(c->seed);
  c->down = std::make_unique<Stream>(c->seed ^ kDown);
  if (rnd(20) == 0) {  // 5%: close early, half of them with RST
    c->abort_at = rnd(c->up_len + 1);
    c->rst = rnd(2) == 0;
  }
  ++g.sessions;
  Conn& ref = *c;
  add(std::move(c));
  return pump_out(ref);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::string role = argv[1], port_file;
  std::vector<int> ports;
  int conns = 50;
  double seconds = 60;
  bool then_idle = false;
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string k = argv[i], v = argv[i + 1];
    if (k == "--port-file") port_file = v;
    else if (k == "--stats-file") g_stats_file = v;
    else if (k == "--conns") conns = atoi(v.c_str());
    else if (k == "--seconds") seconds = atof(v.c_str());
    else if (k == "--then-idle") then_idle = v == "1";
    else if (k == "--seed") g_rng = strtoull(v.c_str(), nullptr, 0);
    else if (k == "--ports") {
      for (char* p = &v[0]; *p;) {
        ports.push_back(static_cast<int>(strtol(p, &p, 10)));
        if (*p == ',') ++p;
      }
    }
  }
  signal(SIGPIPE, SIG_IGN);
  struct sigaction sa{};
  sa.sa_handler = [](int) { g_stop = 1; };
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  g_ep = epoll_create1(EPOLL_CLOEXEC);
  int listener = -1;
  if (role == "server") {
    listener = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    int one = 1;
    setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    if (bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(listener, 1024) != 0 ||
        getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
      perror("soak_peer server");
      return 2;
    }
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.fd = listener;
    epoll_ctl(g_ep, EPOLL_CTL_ADD, listener, &ev);
    std::string tmp = port_file + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    fprintf(f, "%d\n", ntohs(a.sin_port));
    fclose(f);
    rename(tmp.c_str(), port_file.c_str());
  } else if (role != "client" || ports.empty()) {
    fprintf(stderr, "usage: see the top of soak_peer.cc\n");
    return 2;
  }
  if (then_idle) {
    if (role == "client" && !warm_up(ports)) {
      perror("soak_peer client: warm-up session");
      return 1;
    }
    g_start_fds = count_own(false);
    g_start_maps = count_own(true);
  }
  double start = now_s(), last_stats = 0;
  bool draining = false;  // client: the time is up, the open sessions finish
  for (;;) {
    double t = now_s();
    if (role == "client") {
      if (!draining && (t - start >= seconds || g_stop)) draining = true;
      if (draining && (g_conns.empty() || t - start >= seconds + 60)) break;
      while (!draining && static_cast<int>(g_conns.size()) < conns) {
        if (!open_client(ports) && g.connect_failed > 1000) {
          fprintf(stderr, "soak_peer client: connect keeps failing\n");
          return 1;
        }
      }
    } else if (g_stop) {
      break;
    }
    if (t - last_stats >= 1) {
      write_stats(static_cast<int>(g_conns.size()));
      last_stats = t;
    }
    epoll_event evs[64];
    int n = epoll_wait(g_ep, evs, 64, 200);
    for (int i = 0; i < n; ++i) {
      int fd = evs[i].data.fd;
      if (fd == listener) {
        for (int k = 0; k < 16; ++k) {
          int c = accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
          if (c < 0) break;
          auto conn = std::make_unique<Conn>();
          conn->fd = c;
          add(std::move(conn));
        }
        continue;
      }
      auto it = g_conns.find(fd);
      if (it == g_conns.end()) continue;
      Conn& c = *it->second;
      if (evs[i].events & EPOLLOUT) {
        if (!pump_out(c)) continue;
      }
      if (evs[i].events & (EPOLLIN | EPOLLHUP | EPOLLERR)) {
        if (g_conns.count(fd)) on_readable(c);
      }
    }
  }
  g_idle = then_idle && g_conns.empty();
  write_stats(static_cast<int>(g_conns.size()));
  for (double t0 = now_s(); g_idle && !g_stop && now_s() - t0 < 120;) usleep(20 * 1000);
  return g.errors ? 1 : 0;
}
