// interleave_run: runs seeds (see README.md). Per seed it forks and execs an
// interleave_peer server, reads its port, then an interleave_peer client,
// each with or without the preload and RDMASHIM_TEST_SCHEDULE=seed^role as
// the seed's plan says; waits for both (killing them after a deadline), and
// checks their exit status, that the library logged no warning, and which
// transport each end reported against what the plan requires.
//
//   interleave_run --peer BIN --lib LIB [--seed S | --first F --seeds N | --list FILE]
//                  [--exclude FILE] [--jobs J] [--max-seconds T] [--repeat N] [--deadline S]
//                  [--include-known] [--verbose] [--all-plain] [--downgrades]
//
// A range skips the seeds whose plan hits a known bug (plan.h known_bug);
// --include-known runs them too. --repeat runs each seed N times.
// --all-plain runs the seeds with no preload at all: a check of the harness
// and the plans themselves (plain TCP must pass every seed).
// --downgrades adds random moves back to TCP mid-stream (plan.h add_downgrades).
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "plan.h"

extern char** environ;

using namespace interleave;

namespace {

struct Options {
  std::string peer, lib, dir;
  std::vector<uint64_t> seeds;
  std::set<uint64_t> exclude;
  int jobs = 1;
  double max_seconds = 0;
  bool verbose = false;
  bool all_plain = false;  // a control: no preload anywhere, no transport checked
  bool include_known = false;
  bool downgrades = false;  // leave the rings at random points (plan.h add_downgrades)
  int repeat = 1;
  int deadline_s = 30;
};

double now_s() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

std::vector<uint64_t> read_seed_file(const std::string& path) {
  std::vector<uint64_t> out;
  std::ifstream in(path);
  if (!in) {
    fprintf(stderr, "interleave_run: cannot read %s\n", path.c_str());
    exit(2);
  }
  std::string line;
  while (std::getline(in, line)) {
    size_t i = line.find_first_not_of(" \t");
    if (i == std::string::npos || line[i] == '#') continue;
    out.push_back(strtoull(line.c_str() + i, nullptr, 10));
  }
  return out;
}

std::vector<std::string> make_env(const Options& o, const Plan& p, const Side& me, uint64_t role) {
  std::vector<std::string> env, pass;
  for (char** e = environ; *e; ++e) {
    // RDMASHIM_TRANSPORT and RDMASHIM_DISABLE reach the preloaded peers, so
    // that with the upgrade off the transport checks fail, as they must.
    if (!strncmp(*e, "RDMASHIM_TRANSPORT=", 19) || !strncmp(*e, "RDMASHIM_DISABLE=", 17)) pass.push_back(*e);
    if (!strncmp(*e, "LD_PRELOAD=", 11) || !strncmp(*e, "RDMASHIM_", 9)) continue;
    env.push_back(*e);
  }
  if (o.downgrades) env.push_back("INTERLEAVE_STRICT_IDLE=1");
  if (me.plain) return env;
  env.insert(env.end(), pass.begin(), pass.end());
  env.push_back("LD_PRELOAD=" + o.lib);
  // INTERLEAVE_LOG=debug (for replays) raises the library's log level.
  const char* level = getenv("INTERLEAVE_LOG");
  env.push_back(std::string("RDMASHIM_LOG=") + (level && *level ? level : "info"));
  env.push_back("RDMASHIM_TEST_SCHEDULE=" + std::to_string(p.seed ^ role) +
                (me.downgrade ? ",downgrade=" + std::to_string(me.downgrade) : ""));
  if (p.setup_timeout_ms) env.push_back("RDMASHIM_SETUP_TIMEOUT_MS=" + std::to_string(p.setup_timeout_ms));
  if (p.ring_size) env.push_back("RDMASHIM_RING_SIZE=" + std::to_string(p.ring_size));
  if (me.no_spin) env.push_back("RDMASHIM_SPIN_US=0");
  return env;
}

pid_t spawn(const Options& o, const Plan& p, bool client, int port, int port_fd, const std::string& log) {
  const Side& me = client ? p.client : p.server;
  std::vector<std::string> env = make_env(o, p, me, client ? kClientRole : kServerRole);
  std::vector<std::string> args = {"interleave_peer", "--seed", std::to_string(p.seed), "--role",
                                   client ? "client" : "server"};
  if (client) args.insert(args.end(), {"--port", std::to_string(port)});
  else args.insert(args.end(), {"--port-fd", "3"});
  pid_t pid = fork();
  if (pid != 0) return pid;
  int lfd = open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (lfd < 0) _exit(120);
  if (!client) {
    if (dup2(port_fd, 3) < 0) _exit(121);
    if (port_fd != 3) close(port_fd);
  }
  dup2(lfd, 1);
  dup2(lfd, 2);
  if (lfd > 3) close(lfd);
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve(o.peer.c_str(), argv.data(), envp.data());
  _exit(127);
}

std::string slurp(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

// The transport the library reported for the connection ("" if none), and
// any other problem in the log (a warning, more than one outcome, our own FAIL).
// A later tcp:downgraded:<reason> line (the connection left its rings) is
// no second outcome: `downgraded` gets the reason.
std::string outcome_of(const std::string& log, bool fallback, std::string* problem, std::string* downgraded) {
  std::string outcome;
  std::istringstream in(log);
  std::string line;
  while (std::getline(in, line)) {
    if (line.rfind("rdmashim[", 0) == 0) {
      size_t arrow = line.find(" -> ");
      if (line.find("] info: fd ") != std::string::npos && arrow != std::string::npos) {
        std::string o = line.substr(arrow + 4);
        o = o.substr(0, o.find(' '));
        if (o.rfind("tcp:downgraded:", 0) == 0) {
          if ((!downgraded->empty() || outcome != "shm") && problem->empty()) {
            *problem = "downgrade logged after '" + outcome + "'" + (downgraded->empty() ? "" : " (twice)");
          }
          *downgraded = o.substr(15);
          continue;
        }
        // A server that counted an upgrade corrects it when its client could not attach.
        bool correction = (outcome == "shm" || outcome == "verbs") && o == "tcp:setup-failed";
        if (!outcome.empty() && !correction && problem->empty()) *problem = "two outcomes logged: " + outcome + ", " + o;
        outcome = o;
      } else if (line.find("] warn: ") != std::string::npos && problem->empty() &&
                 !(fallback && line.find("verbs: the RDMA provider did not answer within") != std::string::npos)) {
        // (A setup timeout of a few ms may well be shorter than the provider's
        // answer: that warning is the promised one.)
        *problem = "library warning: " + line;
      }
    } else if (line.find("FAIL:") != std::string::npos && problem->empty()) {
      *problem = line;
    }
  }
  return outcome;
}

struct Result {
  bool ok = true;
  std::string why, client, server;
};

// What the plan allows each end to report.
std::string check_outcomes(const Plan& p, const std::string& c, const std::string& s) {
  auto is_tcp = [](const std::string& o) { return o.rfind("tcp:", 0) == 0; };
  bool client_reads = p.client.rx_total > 0 || p.client.read_eof;
  bool server_io = p.server.rx_total > 0 || p.server.read_eof || p.server.tx_total > 0;
  if (p.client.plain && p.server.plain) {
    if (!c.empty() || !s.empty()) return "a plain end logged an outcome";
    return "";
  }
  if (p.client.plain) {
    if (!c.empty()) return "the plain client logged an outcome";
    if (s != "tcp:peer-plain" && s != "tcp:server-spoke-first" && !(s.empty() && !server_io)) {
      return "server reported '" + s + "' with a plain client";
    }
    return "";
  }
  if (p.server.plain) {
    if (!s.empty()) return "the plain server logged an outcome";
    if (c != "tcp:not-advertised") return "client reported '" + c + "' with a plain server";
    return "";
  }
  if (p.fallback) {
    for (const std::string* o : {&c, &s}) {
      if (!o->empty() && *o != "shm" && !is_tcp(*o)) return "unexpected outcome '" + *o + "'";
    }
    if (c.empty() && client_reads) return "the client reported no outcome";
    return "";
  }
  bool spoke_first = p.server_writes_first && s == "tcp:server-spoke-first";
  // A client that never reads may be gone (its rendezvous socket with it)
  // before the server builds the segment.
  bool client_gone = !client_reads && s == "tcp:setup-failed";
  if (s != "shm" && !spoke_first && !client_gone) return "server reported '" + s + "', shm required";
  if (c.empty() && !client_reads) return "";
  if (c != s) return "client reported '" + c + "', server '" + s + "'";
  return "";
}

Result run_seed(const Options& o, int worker, uint64_t seed) {
  Result r;
  Plan p = make_plan(seed);
  if (o.all_plain) p.client.plain = p.server.plain = true;
  if (o.downgrades) add_downgrades(p);
  std::string base = o.dir + "/w" + std::to_string(worker);
  std::string clog = base + ".client.log", slog = base + ".server.log";
  int pp[2];
  if (pipe2(pp, O_CLOEXEC) != 0) {
    r.ok = false, r.why = "pipe failed";
    return r;
  }
  pid_t server = spawn(o, p, false, 0, pp[1], slog);
  close(pp[1]);
  char buf[32] = {};
  size_t got = 0;
  double deadline = now_s() + o.deadline_s;
  while (got < sizeof buf - 1) {
    pollfd pf{pp[0], POLLIN, 0};
    if (poll(&pf, 1, 10000) <= 0) break;
    ssize_t n = read(pp[0], buf + got, sizeof buf - 1 - got);
    if (n <= 0) break;
    got += static_cast<size_t>(n);
    if (memchr(buf, '\n', got)) break;
  }
  close(pp[0]);
  int port = atoi(buf);
  pid_t client = port > 0 ? spawn(o, p, true, port, -1, clog) : -1;
  if (client < 0) {
    r.ok = false;
    r.why = "the server reported no port";
    unlink(clog.c_str());
  }
  int cstatus = 0, sstatus = 0;
  bool cdone = client < 0, sdone = false, killed = false;
  while (!cdone || !sdone) {
    int st = 0;
    pid_t w = waitpid(-1, &st, WNOHANG);
    if (w == client) cdone = true, cstatus = st;
    else if (w == server) sdone = true, sstatus = st;
    if (w > 0) continue;
    double left = deadline - now_s();
    if (left <= 0) {
      if (!cdone) kill(client, SIGKILL);
      if (!sdone) kill(server, SIGKILL);
      killed = true;
      deadline = now_s() + 5;
      continue;
    }
    sigset_t chld;
    sigemptyset(&chld);
    sigaddset(&chld, SIGCHLD);
    timespec ts{0, 20'000'000};
    sigtimedwait(&chld, nullptr, &ts);
  }
  std::string cproblem, sproblem;
  std::string clogt = client >= 0 ? slurp(clog) : "", slogt = slurp(slog);
  std::string cdown, sdown;
  r.client = outcome_of(clogt, p.fallback, &cproblem, &cdown);
  r.server = outcome_of(slogt, p.fallback, &sproblem, &sdown);
  // Only a seed that asks for downgrades may see one.
  if (!o.downgrades && (!cdown.empty() || !sdown.empty())) cproblem = "downgraded without --downgrades";
  auto status = [](const char* who, int st) -> std::string {
    if (WIFEXITED(st) && WEXITSTATUS(st) == 0) return "";
    if (WIFEXITED(st)) return std::string(who) + " exited " + std::to_string(WEXITSTATUS(st));
    return std::string(who) + " killed by signal " + std::to_string(WTERMSIG(st));
  };
  std::string why;
  if (killed) why = "hang: killed after " + std::to_string(o.deadline_s) + " s";
  for (const std::string& w : {cproblem, sproblem, status("client", cstatus), status("server", sstatus),
                               check_outcomes(p, r.client, r.server)}) {
    if (!w.empty() && why.empty()) why = w;
  }
  if (!cdown.empty()) r.client += "+down";  // the summary counts them
  if (!sdown.empty()) r.server += "+down";
  if (r.ok && !why.empty()) r.ok = false, r.why = why;
  if (!r.ok) {
    auto tail = [](const std::string& t) {
      std::string s = t.size() > 3000 ? "..." + t.substr(t.size() - 3000) : t;
      std::string out;
      std::istringstream in(s);
      std::string line;
      while (std::getline(in, line)) out += "    " + line + "\n";
      return out;
    };
    r.why += "\n  plan: " + describe(p) + "\n  client log:\n" + tail(clogt) + "  server log:\n" + tail(slogt) +
             "  replay: tests/interleave/run_seed.sh " + std::to_string(seed);
  }
  return r;
}

void usage() {
  fprintf(stderr,
          "usage: interleave_run --peer BIN --lib LIB [--seed S | --first F --seeds N | --list FILE]\n"
          "                      [--exclude FILE] [--jobs J] [--max-seconds T] [--repeat N] [--deadline S]\n"
          "                      [--include-known] [--verbose] [--all-plain] [--downgrades]\n");
  exit(2);
}

}  // namespace

int main(int argc, char** argv) {
  Options o;
  uint64_t first = 1, count = 0;
  bool have_range = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) usage();
      return argv[++i];
    };
    if (a == "--peer") o.peer = val();
    else if (a == "--lib") o.lib = val();
    else if (a == "--seed") o.seeds.push_back(strtoull(val().c_str(), nullptr, 10));
    else if (a == "--first") first = strtoull(val().c_str(), nullptr, 10), have_range = true;
    else if (a == "--seeds") count = strtoull(val().c_str(), nullptr, 10), have_range = true;
    else if (a == "--list") for (uint64_t s : read_seed_file(val())) o.seeds.push_back(s);
    else if (a == "--exclude") for (uint64_t s : read_seed_file(val())) o.exclude.insert(s);
    else if (a == "--jobs") o.jobs = atoi(val().c_str());
    else if (a == "--max-seconds") o.max_seconds = atof(val().c_str());
    else if (a == "--deadline") o.deadline_s = atoi(val().c_str());
    else if (a == "--verbose") o.verbose = true;
    else if (a == "--all-plain") o.all_plain = true;
    else if (a == "--include-known") o.include_known = true;
    else if (a == "--downgrades") o.downgrades = true;
    else if (a == "--repeat") o.repeat = atoi(val().c_str());
    else usage();
  }
  std::map<std::string, size_t> skipped;
  if (have_range) {
    for (uint64_t s = first; s < first + count; ++s) {
      const char* bug = o.include_known || o.all_plain ? nullptr : known_bug(make_plan(s));
      if (bug) ++skipped[bug];
      else o.seeds.push_back(s);
    }
  }
  if (o.peer.empty() || o.lib.empty() || o.seeds.empty() || o.jobs < 1) usage();
  if (access(o.peer.c_str(), X_OK) != 0 || access(o.lib.c_str(), R_OK) != 0) {
    fprintf(stderr, "interleave_run: %s or %s missing\n", o.peer.c_str(), o.lib.c_str());
    return 2;
  }
  char tmpl[] = "/tmp/interleave.XXXXXX";
  if (!mkdtemp(tmpl)) return 2;
  o.dir = tmpl;
  std::vector<uint64_t> seeds;
  size_t excluded = 0;
  for (uint64_t s : o.seeds) {
    if (o.exclude.count(s)) ++excluded;
    else for (int i = 0; i < o.repeat; ++i) seeds.push_back(s);
  }

  // Workers take every jobs-th seed and send one line per seed back.
  sigset_t chld;
  sigemptyset(&chld);
  sigaddset(&chld, SIGCHLD);
  int res[2];
  if (pipe(res) != 0) return 2;
  double start = now_s();
  std::vector<pid_t> workers;
  for (int w = 0; w < o.jobs; ++w) {
    pid_t pid = fork();
    if (pid == 0) {
      close(res[0]);
      sigprocmask(SIG_BLOCK, &chld, nullptr);
      for (size_t i = static_cast<size_t>(w); i < seeds.size(); i += static_cast<size_t>(o.jobs)) {
        if (o.max_seconds > 0 && now_s() - start > o.max_seconds) break;
        double t0 = now_s();
        Result r = run_seed(o, w, seeds[i]);
        if (!r.ok || o.verbose) {
          char ms[32];
          snprintf(ms, sizeof ms, " (%.0f ms)", (now_s() - t0) * 1000);
          std::string msg = (r.ok ? "ok   seed " : "FAIL seed ") + std::to_string(seeds[i]) + ": " +
                            (r.ok ? r.client + " / " + r.server + ms : r.why) + "\n";
          if (r.ok && o.seeds.size() <= 16) msg += "  plan: " + describe(make_plan(seeds[i])) + "\n";
          (void)!write(1, msg.data(), msg.size());
        }
        char line[160];
        int n = snprintf(line, sizeof line, "%llu %d %s %s\n", static_cast<unsigned long long>(seeds[i]),
                         r.ok ? 1 : 0, r.client.empty() ? "-" : r.client.c_str(),
                         r.server.empty() ? "-" : r.server.c_str());
        (void)!write(res[1], line, static_cast<size_t>(n));
      }
      _exit(0);
    }
    workers.push_back(pid);
  }
  close(res[1]);
  FILE* in = fdopen(res[0], "r");
  size_t ran = 0;
  std::vector<uint64_t> failed;
  std::map<std::string, size_t> outcomes;
  char line[256];
  while (fgets(line, sizeof line, in)) {
    unsigned long long seed;
    int ok;
    char c[64], s[64];
    if (sscanf(line, "%llu %d %63s %63s", &seed, &ok, c, s) != 4) continue;
    ++ran;
    if (!ok) failed.push_back(seed);
    ++outcomes[std::string(c) + "/" + s];
  }
  for (pid_t w : workers) waitpid(w, nullptr, 0);
  double took = now_s() - start;
  std::string cleanup = "rm -rf '" + o.dir + "'";
  (void)!system(cleanup.c_str());

  printf("interleave: %zu of %zu runs done in %.1f s (%zu seeds excluded by list), %zu failed\n", ran,
         seeds.size(), took, excluded, failed.size());
  for (auto& [bug, n] : skipped) printf("  skipped %zu seeds of known bug %s (README.md; --include-known runs them)\n", n, bug.c_str());
  printf("  outcomes (client/server):");
  for (auto& [k, v] : outcomes) printf(" %s=%zu", k.c_str(), v);
  printf("\n");
  if (!failed.empty()) {
    printf("  failing seeds:");
    for (uint64_t s : failed) printf(" %llu", static_cast<unsigned long long>(s));
    printf("\n");
  }
  return failed.empty() ? 0 : 1;
}
