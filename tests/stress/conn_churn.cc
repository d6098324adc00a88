// Connection churn: a client opens, uses and closes connections one after
// another (warm-up W, then N more) against a server that serves them one
// after another; each side then checks, on itself (/proc/self is
// /proc/<its pid>), that nothing stayed behind:
//   - descriptors: /proc/self/fd count after the N connections vs after the
//     warm-up, growth at most --max-fd-growth (2)
//   - memory: VmRSS growth at most --max-rss-growth-kb (4096) after warm-up
//   - threads: the same count
//   - shared memory: no /proc/self/fd entry naming memfd:rdmashim-ring and no
//     /proc/self/maps line naming it, once all connections are closed
// It also samples the ring memfds, open or mapped (the memfd is closed once
// mapped unless the socket survives exec), while a connection is open (every
// 50th), so a run under rdmashim can show the connections really were on
// shared memory (ring_fds_open_max > 0).
//
// Each connection: the client sends {u32 length, u32 close mode} and a
// payload of 1..4096 bytes (varying), the server echoes the payload, the
// client checks it; then one of three endings, in turn:
//   0 client closes first (the server reads EOF, then closes)
//   1 server closes first (the client reads EOF, then closes)
//   2 client shutdown(SHUT_WR), server reads EOF and closes, client reads EOF
//
// usage: conn_churn server --port-file F --conns N --warmup W [limits]
//        conn_churn client --port P --conns N --warmup W [limits]
// limits: --max-fd-growth K, --max-rss-growth-kb KB, --allow-resets 0|1 (1: an
// ECONNRESET where EOF is due is counted but not a failure; diagnosis only)
// Prints one JSON line per side with the measurements; exits 0 when every
// exchange and every check passed.
#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

namespace {

struct Snapshot {
  int fds = 0;
  int ring_fds = 0;
  int ring_maps = 0;
  long rss_kb = 0;
  int threads = 0;
};

Snapshot snapshot() {
  Snapshot s;
  if (DIR* d = opendir("/proc/self/fd")) {
    int self = dirfd(d);
    while (dirent* e = readdir(d)) {
      if (e->d_name[0] == '.') continue;
      if (atoi(e->d_name) == self) continue;  // the directory we are reading
      ++s.fds;
      char target[256] = {0};
      std::string path = std::string("/proc/self/fd/") + e->d_name;
      ssize_t n = readlink(path.c_str(), target, sizeof target - 1);
      if (n > 0 && strstr(target, "memfd:rdmashim-ring")) ++s.ring_fds;
      if (getenv("CHURN_LIST_FDS")) fprintf(stderr, "conn_churn[%d]: fd %s -> %s\n", getpid(), e->d_name, target);
    }
    closedir(d);
  }
  std::ifstream maps("/proc/self/maps");
  for (std::string line; std::getline(maps, line);)
    if (line.find("rdmashim-ring") != std::string::npos) ++s.ring_maps;
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("VmRSS:", 0) == 0) s.rss_kb = atol(line.c_str() + 6);
    if (line.rfind("Threads:", 0) == 0) s.threads = atoi(line.c_str() + 8);
  }
  return s;
}

std::string json(const Snapshot& s) {
  char buf[200];
  snprintf(buf, sizeof buf, "{\"fds\":%d,\"rss_kb\":%ld,\"threads\":%d,\"ring_fds\":%d,\"ring_maps\":%d}", s.fds,
           s.rss_kb, s.threads, s.ring_fds, s.ring_maps);
  return buf;
}

bool read_full(int fd, void* buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = recv(fd, static_cast<char*>(buf) + done, len - done, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

bool write_full(int fd, const void* buf, size_t len) {
  size_t done = 0;
  while (done < len) {
    ssize_t n = send(fd, static_cast<const char*>(buf) + done, len - done, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    done += static_cast<size_t>(n);
  }
  return true;
}

int resets = 0;  // ECONNRESET where the peer's graceful close must read as EOF
bool allow_resets = false;  // --allow-resets 1: count them, do not fail on them (diagnosis only)

// recv() must report EOF (0), not data or an error.
bool expect_eof(int fd) {
  char c;
  for (;;) {
    ssize_t n = recv(fd, &c, 1, 0);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0 && errno == ECONNRESET) {
      ++resets;
      return allow_resets;
    }
    return n == 0;
  }
}

struct Header {
  uint32_t length;
  uint32_t mode;
};

size_t payload_size(uint64_t i) { return 1 + (i * 617) % 4096; }

void fill(std::vector<char>& v, uint64_t i) {
  for (size_t k = 0; k < v.size(); ++k) v[k] = static_cast<char>((k * 31 + i * 7) & 0xff);
}

struct Options {
  std::string role;
  std::string port_file;
  uint16_t port = 0;
  uint64_t conns = 1000;
  uint64_t warmup = 50;
  int max_fd_growth = 2;
  long max_rss_growth_kb = 4096;
};

int failures = 0;

void fail(const char* role, uint64_t i, const char* what) {
  ++failures;
  fprintf(stderr, "conn_churn %s: connection %llu: %s (%s)\n", role, static_cast<unsigned long long>(i), what,
          strerror(errno));
}

// Checks the end state against the state after warm-up; prints the report.
int report(const Options& o, const Snapshot& before, const Snapshot& after, int ring_open_max, double seconds) {
  int bad = failures;
  auto check = [&](bool ok, const char* what) {
    if (!ok) {
      ++bad;
      fprintf(stderr, "conn_churn %s: FAIL: %s\n", o.role.c_str(), what);
    }
  };
  check(after.fds - before.fds <= o.max_fd_growth, "descriptors leaked");
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__)
  // A sanitizer holds freed memory back (ASan's quarantine): resident memory
  // says nothing here. LeakSanitizer checks for leaks at exit instead.
  (void)o.max_rss_growth_kb;
#else
  check(after.rss_kb - before.rss_kb <= o.max_rss_growth_kb, "resident memory grew");
#endif
  check(after.threads == before.threads, "thread count changed");
  check(after.ring_fds == 0, "ring memfd descriptors left open after every connection closed");
  check(after.ring_maps == 0, "ring memfd mappings left after every connection closed");
  printf("{\"role\":\"%s\",\"conns\":%llu,\"warmup\":%llu,\"seconds\":%.3f,\"failures\":%d,"
         "\"resets_instead_of_eof\":%d,\"ring_fds_open_max\":%d,"
         "\"fd_growth\":%d,\"rss_growth_kb\":%ld,\"after_warmup\":%s,\"after_all\":%s}\n",
         o.role.c_str(), static_cast<unsigned long long>(o.conns), static_cast<unsigned long long>(o.warmup), seconds,
         failures, resets, ring_open_max, after.fds - before.fds, after.rss_kb - before.rss_kb, json(before).c_str(),
         json(after).c_str());
  fflush(stdout);
  return bad ? 1 : 0;
}

double since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

int run_server(const Options& o) {
  int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  int one = 1;
  setsockopt(l, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (bind(l, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || listen(l, 64) != 0) {
    perror("conn_churn server: listen");
    return 2;
  }
  getsockname(l, reinterpret_cast<sockaddr*>(&a), &len);
  {
    std::string tmp = o.port_file + ".tmp";
    FILE* f = fopen(tmp.c_str(), "w");
    if (!f) return perror("conn_churn server: port file"), 2;
    fprintf(f, "%u\n", ntohs(a.sin_port));
    fclose(f);
    rename(tmp.c_str(), o.port_file.c_str());
  }
  Snapshot before;
  int ring_open_max = 0;
  auto start = std::chrono::steady_clock::now();
  std::vector<char> buf;
  for (uint64_t i = 0; i < o.warmup + o.conns; ++i) {
    if (i == o.warmup) {
      before = snapshot();
      start = std::chrono::steady_clock::now();
    }
    int fd = accept4(l, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) {
      fail("server", i, "accept");
      if (errno == EINTR) continue;
      break;
    }
    Header h{};
    if (!read_full(fd, &h, sizeof h) || h.length == 0 || h.length > 65536 || h.mode > 2) {
      fail("server", i, "bad header");
      close(fd);
      continue;
    }
    buf.resize(h.length);
    if (!read_full(fd, buf.data(), buf.size()) || !write_full(fd, buf.data(), buf.size())) {
      fail("server", i, "echo");
      close(fd);
      continue;
    }
    if (i % 50 == 0) {
      Snapshot now = snapshot();
      ring_open_max = std::max({ring_open_max, now.ring_fds, now.ring_maps});
    }
    if (h.mode != 1 && !expect_eof(fd)) fail("server", i, "expected EOF from the client");
    close(fd);
  }
  double seconds = since(start);
  Snapshot after = snapshot();  // with the listener still open, as in `before`
  close(l);
  return report(o, before, after, ring_open_max, seconds);
}

int run_client(const Options& o) {
  Snapshot before;
  int ring_open_max = 0;
  auto start = std::chrono::steady_clock::now();
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(o.port);
  std::vector<char> out, in;
  for (uint64_t i = 0; i < o.warmup + o.conns; ++i) {
    if (i == o.warmup) {
      before = snapshot();
      start = std::chrono::steady_clock::now();
    }
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0 || connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) {
      fail("client", i, "connect");
      if (fd >= 0) close(fd);
      return report(o, before.fds ? before : snapshot(), snapshot(), ring_open_max, since(start)) | 1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    Header h{static_cast<uint32_t>(payload_size(i)), static_cast<uint32_t>(i % 3)};
    out.resize(h.length);
    in.assign(h.length, 0);
    fill(out, i);
    if (!write_full(fd, &h, sizeof h) || !write_full(fd, out.data(), out.size()) ||
        !read_full(fd, in.data(), in.size())) {
      fail("client", i, "exchange");
    } else if (in != out) {
      fail("client", i, "echo differs");
    }
    if (i % 50 == 0) {
      Snapshot now = snapshot();
      ring_open_max = std::max({ring_open_max, now.ring_fds, now.ring_maps});
    }
    if (h.mode == 1 && !expect_eof(fd)) fail("client", i, "expected EOF from the server");
    if (h.mode == 2) {
      shutdown(fd, SHUT_WR);
      if (!expect_eof(fd)) fail("client", i, "expected EOF after shutdown");
    }
    close(fd);
  }
  double seconds = since(start);
  return report(o, before, snapshot(), ring_open_max, seconds);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  if (argc < 2) {
    fprintf(stderr, "usage: conn_churn server|client [--port-file F] [--port P] [--conns N] [--warmup W]\n"
                    "       [--max-fd-growth K] [--max-rss-growth-kb KB]\n");
    return 2;
  }
  o.role = argv[1];
  for (int i = 2; i + 1 < argc; i += 2) {
    std::string a = argv[i];
    const char* v = argv[i + 1];
    if (a == "--port-file") o.port_file = v;
    else if (a == "--port") o.port = static_cast<uint16_t>(atoi(v));
    else if (a == "--conns") o.conns = strtoull(v, nullptr, 10);
    else if (a == "--warmup") o.warmup = strtoull(v, nullptr, 10);
    else if (a == "--max-fd-growth") o.max_fd_growth = atoi(v);
    else if (a == "--max-rss-growth-kb") o.max_rss_growth_kb = atol(v);
    else if (a == "--allow-resets") allow_resets = atoi(v) != 0;
    else return fprintf(stderr, "conn_churn: unknown option %s\n", a.c_str()), 2;
  }
  if (o.role == "server" && !o.port_file.empty()) return run_server(o);
  if (o.role == "client" && o.port != 0) return run_client(o);
  fprintf(stderr, "conn_churn: server needs --port-file, client needs --port\n");
  return 2;
}
