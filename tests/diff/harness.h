// Differential test harness: the scenario framework.
//
// A scenario runs once on plain TCP and once under `rdmashim run`; each
// prints a transcript of what an unmodified program observes (return values,
// errno names, bytes, readiness) and the driver (run_diff.sh) compares the
// two. Everything printed must be a fact the kernel guarantees after an
// explicit barrier, never a timing or a buffer size.
//
// Processes and threads write transcript lines with T(); every line goes at
// once, as one SOCK_SEQPACKET message, to the collector (the process that
// started the scenario), which prints them grouped by role (sorted) and in
// order within a role. A crashed or hung process therefore still shows what
// it did up to that point. Roles are names like "server", "client",
// "client.t3": a role must be written by one thread at a time.
//
// Only the plain POSIX/Linux socket API is used: no rdmashim header.
#pragma once

#include <poll.h>
#include <signal.h>
#include <stdint.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/types.h>

#include <functional>
#include <string>
#include <vector>

namespace diff {

// ---- scenarios -------------------------------------------------------------

using ScenarioFn = void (*)();
struct Registrar {
  Registrar(const char* name, int min_shm, int max_tcp, ScenarioFn fn);
};

// SCENARIO(name, min_shm): min_shm is how many "-> shm" reports (one per
// connection end that did I/O) the rdmashim run must show at least; no
// "-> tcp:..." report is allowed. SCENARIO_TCP also allows up to max_tcp
// connection ends to stay TCP. Keep each at the start of a line: CMake reads
// the scenario names from the sources.
#define SCENARIO(name, min_shm) SCENARIO_TCP(name, min_shm, 0)
#define SCENARIO_TCP(name, min_shm, max_tcp)                                     \
  static void scenario_##name();                                                  \
  static ::diff::Registrar registrar_##name(#name, min_shm, max_tcp, scenario_##name); \
  static void scenario_##name()

// A mode entered by re-executing this binary (`--post-exec MODE ARGS...`):
// for exec scenarios. The process keeps its alarm and results descriptor.
using ExecModeFn = void (*)(int argc, char** argv);
struct ExecModeRegistrar {
  ExecModeRegistrar(const char* name, ExecModeFn fn);
};
#define EXEC_MODE(name)                                                   \
  static void exec_mode_##name(int argc, char** argv);                    \
  static ::diff::ExecModeRegistrar exec_registrar_##name(#name, exec_mode_##name); \
  static void exec_mode_##name(int argc, char** argv)

// Re-executes this binary in MODE with extra args (never returns on success).
// Keeps the environment (hence LD_PRELOAD) and the results descriptor.
[[noreturn]] void reexec(const char* mode, const std::vector<std::string>& args,
                         const std::vector<std::string>& extra_env = {});

// ---- transcript ------------------------------------------------------------

void set_role(const std::string& role);  // this thread's role (inherited by fork)
const std::string& role();
void T(const char* fmt, ...) __attribute__((format(printf, 1, 2)));
// Fatal: records the message, then _exit(1). The transcript shows where.
[[noreturn]] void fatal(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

const char* ename(int e);              // "EAGAIN"
std::string E(long r);                 // "5" or "-1 EAGAIN" (reads errno: call right after)
std::string pollev(short revents);     // "POLLIN|POLLOUT" or "0"
std::string epollev(uint32_t events);  // "EPOLLIN|EPOLLRDHUP" or "0"
std::string yes(bool b);               // "yes" / "no"
std::string quote(const void* p, size_t n);  // printable rendering of bytes

// ---- processes -------------------------------------------------------------

constexpr int kProcessAlarmS = 15;  // every scenario process dies after this
constexpr int kBoundMs = 5000;      // "eventually" and "returns within" bounds

// fork(); the child takes `role`, arms its alarm, runs fn and exits 0.
pid_t spawn(const std::string& role, const std::function<void()>& fn);
// fork() with the child's alarm armed (for scenarios that manage the child).
pid_t xfork();
// waitpid and record "<what> exit=N" or "<what> killed by SIGX".
void reap(pid_t pid, const char* what);
// Flushes nothing (lines are sent at once); _exit(code) after a "bye".
[[noreturn]] void finish(int code = 0);

// ---- sockets ---------------------------------------------------------------

// Listening TCP socket on 127.0.0.1, ephemeral port (returned in *port).
int make_listener(uint16_t* port, int type_flags = 0, int backlog = 64);
// Blocking connect to 127.0.0.1:port; fatal on failure.
int connect_to(uint16_t port, int type_flags = 0);
int accept_one(int lfd, int flags = 0);

// Exactly n bytes, waiting (with poll for non-blocking descriptors); fatal
// on error or EOF.
void read_exact(int fd, void* buf, size_t n);
void write_all(int fd, const void* buf, size_t n);
// Reads until EOF; returns the count, *sum gets the checksum.
uint64_t read_to_eof(int fd, uint64_t* sum);
// Two round trips on a fresh connection, so both directions of an rdmashim
// connection are on the ring before the scenario proper starts.
void warm_server(int fd);
void warm_client(int fd);

// Waits until poll(fd) reports any of `want` (or kBoundMs); returns revents
// of the last poll (0 if it timed out).
short poll_until(int fd, short events, short want, int bound_ms = kBoundMs);
// Same for one epoll set: returns the union of events seen for `data` in the
// last epoll_wait that reported it, 0 on timeout.
uint32_t epoll_until(int ep, uint64_t data, uint32_t want, int bound_ms = kBoundMs);

// A deterministic byte stream: byte i of stream `seed`.
inline uint8_t pattern(uint64_t seed, uint64_t i) {
  uint64_t x = (i + 1) * 0x9E3779B97F4A7C15ull ^ (seed * 0xD6E8FEB86659FD93ull);
  x ^= x >> 29;
  return static_cast<uint8_t>(x ^ (x >> 17));
}
void fill_pattern(uint64_t seed, uint64_t offset, void* buf, size_t n);
// FNV-1a 64, incremental: start with kFnvInit.
constexpr uint64_t kFnvInit = 0xcbf29ce484222325ull;
uint64_t fnv(uint64_t h, const void* p, size_t n);
uint64_t pattern_sum(uint64_t seed, uint64_t n);  // checksum of the first n bytes

// Sends n pattern bytes of `seed` in ragged chunks; returns the checksum.
uint64_t send_stream(int fd, uint64_t seed, uint64_t n);
// Receives exactly n bytes in ragged chunks; returns the checksum.
uint64_t recv_stream(int fd, uint64_t seed, uint64_t n);

uint64_t now_ms();
void sleep_ms(int ms);

// ---- the control channel between the two ends -------------------------------
// A socketpair (AF_UNIX, never touched by rdmashim) used as a barrier and to
// pass numbers. Every wait is bounded: a peer that is gone or hung is fatal.
struct Ctl {
  int fd = -1;
  void sync();            // both ends call it; returns when both reached it
  void put(uint64_t v);
  uint64_t get();
};
// A pair of connected control channels: a[0] for one end, a[1] for the other.
void make_ctl(Ctl* a, Ctl* b);

// ---- the usual two-process shape -------------------------------------------
struct Pair {
  int fd = -1;      // the connected TCP socket of this end
  int lfd = -1;     // the listener (server end only)
  uint16_t port = 0;
  Ctl ctl;
};
struct PairOpts {
  bool warm = true;          // two round trips before the scenario body
  int accept_flags = 0;      // accept4 flags (server)
  int socket_flags = 0;      // socket() type flags (client)
};
// The current process becomes "server": listens, forks "client" (which
// connects and runs `client`), accepts and runs `server`; then reaps the
// client. Both bodies get their connected socket in p.fd and leave it open
// or closed as they like.
void run_pair(const std::function<void(Pair&)>& server, const std::function<void(Pair&)>& client,
              PairOpts opts = {});

}  // namespace diff
