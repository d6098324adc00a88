// Processes: fork per connection, prefork, daemons, a connection handed
// from parent to child or shared by both, vfork/posix_spawn/system while a
// connection is open, and descriptors inherited across execve (a client that
// re-executes itself, an inetd-style server, an activated listener).
#include <spawn.h>
#include <stdlib.h>
#include <sys/stat.h>

#include "sc_common.h"

extern char** environ;

using namespace diff;

namespace {

// A tiny request/response protocol: "REQn\n" (5 bytes) asks for
// 10000 * (n + 1) pattern bytes of stream 30 + n; "QUIT\n" stops a worker.
bool serve_one(int fd, const char* who) {
  char req[5];
  read_exact(fd, req, 5);
  if (memcmp(req, "QUIT\n", 5) == 0) {
    close(fd);
    return false;
  }
  int n = req[3] - '0';
  uint64_t len = 10000ull * static_cast<uint64_t>(n + 1);
  std::vector<char> b(len);
  fill_pattern(30 + n, 0, b.data(), len);
  write_all(fd, b.data(), len);
  close(fd);
  if (who) T("%s served REQ%d", who, n);
  return true;
}

void request(uint16_t port, int n) {
  int fd = connect_to(port);
  char req[6];
  snprintf(req, sizeof req, "REQ%d\n", n);
  write_all(fd, req, 5);
  uint64_t sum = 0;
  uint64_t got = read_to_eof(fd, &sum);
  uint64_t len = 10000ull * static_cast<uint64_t>(n + 1);
  T("REQ%d: got %llu bytes, pattern: %s", n, static_cast<unsigned long long>(got),
    yes(got == len && sum == pattern_sum(30 + n, len)).c_str());
  close(fd);
}

void quit(uint16_t port) {
  int fd = connect_to(port);
  write_all(fd, "QUIT\n", 5);
  char c;
  T("QUIT: read = %s", E(read(fd, &c, 1)).c_str());
  close(fd);
}

// Exchanges one tag each way, then 200 KB each way, on fd (server side of
// echo_stream_peer).
void exchange(int fd, const char* tag, uint64_t seed) {
  size_t n = strlen(tag);
  write_all(fd, tag, n);
  char buf[64];
  read_exact(fd, buf, n);
  bool ok = memcmp(buf, tag, n) == 0;
  uint64_t h = send_stream(fd, seed, 200000);
  uint64_t back = recv_stream(fd, seed, 200000);
  T("%s: echo ok: %s, 200000 bytes round trip ok: %s", tag, yes(ok).c_str(),
    yes(h == back && h == pattern_sum(seed, 200000)).c_str());
}

// The peer of exchange(): for each round, the tag length comes by ctl.
void echo_stream_peer(int fd, Ctl& ctl) {
  for (;;) {
    uint64_t n = ctl.get();
    if (n == 0) break;
    char buf[64];
    read_exact(fd, buf, n);
    write_all(fd, buf, n);
    std::vector<char> b(200000);
    read_exact(fd, b.data(), b.size());
    write_all(fd, b.data(), b.size());
  }
}

}  // namespace

SCENARIO(proc_fork_per_conn, 6) {
  set_role("server");
  uint16_t port;
  int lfd = make_listener(&port);
  pid_t client = spawn("client", [&] {
    close(lfd);
    for (int i = 0; i < 3; ++i) request(port, i);
  });
  std::vector<pid_t> workers;
  for (int i = 0; i < 3; ++i) {
    int fd = accept_one(lfd);
    std::string who = "worker" + std::to_string(i);
    workers.push_back(spawn(who, [&] {
      close(lfd);
      serve_one(fd, role().c_str());
    }));
    T("accepted connection %d, forked, closed our copy: %s", i, E(close(fd)).c_str());
  }
  for (int i = 0; i < 3; ++i) reap(workers[i], ("worker" + std::to_string(i)).c_str());
  reap(client, "client");
}

SCENARIO(proc_prefork, 8) {
  set_role("master");
  uint16_t port;
  int lfd = make_listener(&port);
  int counts[2];
  pipe(counts);
  std::vector<pid_t> workers;
  for (int w = 0; w < 2; ++w) {
    workers.push_back(spawn("worker" + std::to_string(w), [&] {
      close(counts[0]);
      uint32_t served = 0;
      for (;;) {
        int fd = accept(lfd, nullptr, nullptr);
        if (fd < 0) {
          if (errno == EINTR) continue;
          T("accept = %s", E(fd).c_str());
          break;
        }
        if (!serve_one(fd, nullptr)) break;
        served++;
      }
      write(counts[1], &served, sizeof served);
      T("stopped by QUIT");
    }));
  }
  close(counts[1]);
  std::vector<pid_t> clients;
  for (int c = 0; c < 4; ++c) clients.push_back(spawn("client" + std::to_string(c), [&, c] { request(port, c); }));
  for (int c = 0; c < 4; ++c) reap(clients[c], ("client" + std::to_string(c)).c_str());
  quit(port);
  quit(port);
  for (int w = 0; w < 2; ++w) reap(workers[w], ("worker" + std::to_string(w)).c_str());
  uint32_t total = 0, n = 0;
  while (read(counts[0], &n, sizeof n) == sizeof n) total += n;
  T("requests served by the two workers together: %u", total);
}

SCENARIO(proc_daemonize, 2) {
  set_role("launcher");
  uint16_t port;
  int lfd = make_listener(&port);
  int ready[2];
  pipe(ready);
  pid_t first = spawn("first-child", [&] {
    T("setsid = %s", setsid() > 0 ? "ok" : E(-1).c_str());
    pid_t daemon = spawn("daemon", [&] {
      chdir("/");
      umask(0);
      close(ready[0]);
      write(ready[1], "R", 1);
      close(ready[1]);
      int fd = accept_one(lfd);
      close(lfd);
      serve_one(fd, "daemon");
    });
    (void)daemon;
    T("exits, leaving the grandchild");
  });
  reap(first, "first-child");
  close(ready[1]);
  char c;
  read(ready[0], &c, 1);
  close(lfd);
  set_role("client");
  request(port, 4);
}

SCENARIO(proc_parent_then_child, 2) {
  run_pair(
      [](Pair& p) {
        p.ctl.put(strlen("by-parent"));
        exchange(p.fd, "by-parent", 50);
        pid_t kid = spawn("server-child", [&] {
          p.ctl.put(strlen("by-child"));
          exchange(p.fd, "by-child", 51);
          p.ctl.put(strlen("by-child-2"));
          exchange(p.fd, "by-child-2", 52);
          p.ctl.put(0);
          close(p.fd);
        });
        T("forked; parent closes its copy = %s", E(close(p.fd)).c_str());
        reap(kid, "server-child");
      },
      [](Pair& p) {
        echo_stream_peer(p.fd, p.ctl);
        char c;
        T("after the child closed: read = %s", E(read(p.fd, &c, 1)).c_str());
      });
}

// sshd's privilege separation: the parent reads part of the client's first
// bytes (byte by byte, up to a newline) before the stream is on the ring,
// forks a child that reads the rest and everything after (past the Switch),
// and takes the stream back once the child is gone, starting with poll().
SCENARIO(proc_child_takes_over_then_parent_polls, 2) {
  PairOpts cold;
  cold.warm = false;
  run_pair(
      [](Pair& p) {
        p.ctl.sync();  // the client's first bytes went out before anything of ours was read
        char line[16];
        size_t n = 0;
        while (n < sizeof line && (n == 0 || line[n - 1] != '\n')) read_exact(p.fd, line + n++, 1);
        T("parent read %s byte by byte", quote(line, n).c_str());
        pid_t kid = spawn("server-child", [&] {
          char b[16];
          read_exact(p.fd, b, 4);
          T("read %s", quote(b, 4).c_str());
          p.ctl.sync();  // the client writes more
          read_exact(p.fd, b, 10);
          T("read %s", quote(b, 10).c_str());
          write_all(p.fd, "child-reply", 11);
          close(p.fd);
        });
        reap(kid, "server-child");
        p.ctl.sync();  // the client writes to the parent now
        short ev = poll_until(p.fd, POLLIN, POLLIN);
        T("parent poll = %s", pollev(ev).c_str());
        char b[9];
        read_exact(p.fd, b, 9);
        T("parent read %s", quote(b, 9).c_str());
        write_all(p.fd, "parent-reply", 12);
        p.ctl.sync();
      },
      [](Pair& p) {
        write_all(p.fd, "banner\r\nREST", 12);
        p.ctl.sync();
        p.ctl.sync();
        write_all(p.fd, "after-fork", 10);
        char b[16];
        read_exact(p.fd, b, 11);
        T("got %s", quote(b, 11).c_str());
        p.ctl.sync();
        write_all(p.fd, "to-parent", 9);
        read_exact(p.fd, b, 12);
        T("got %s", quote(b, 12).c_str());
        p.ctl.sync();
      },
      cold);
}

SCENARIO(proc_parent_child_alternate, 2) {
  run_pair(
      [](Pair& p) {
        Ctl mine, kids;
        make_ctl(&mine, &kids);
        pid_t kid = spawn("server-child", [&] {
          close(mine.fd);
          kids.sync();  // parent wrote P1
          write_all(p.fd, "C1", 2);
          kids.sync();
          kids.sync();  // parent wrote P2
          write_all(p.fd, "C2", 2);
          kids.sync();
          char b[2];
          kids.sync();  // parent read R1
          read_exact(p.fd, b, 2);
          T("read %s", quote(b, 2).c_str());
          kids.sync();
          kids.sync();  // parent read R3
          read_exact(p.fd, b, 2);
          T("read %s", quote(b, 2).c_str());
          kids.sync();
        });
        close(kids.fd);
        write_all(p.fd, "P1", 2);
        mine.sync();
        mine.sync();  // child wrote C1
        write_all(p.fd, "P2", 2);
        mine.sync();
        mine.sync();  // child wrote C2
        char b[2];
        read_exact(p.fd, b, 2);
        T("read %s", quote(b, 2).c_str());
        mine.sync();
        mine.sync();  // child read R2
        read_exact(p.fd, b, 2);
        T("read %s", quote(b, 2).c_str());
        mine.sync();
        mine.sync();  // child read R4
        reap(kid, "server-child");
        p.ctl.sync();
      },
      [](Pair& p) {
        char b[8];
        read_exact(p.fd, b, 8);
        T("got %s (parent and child alternating)", quote(b, 8).c_str());
        write_all(p.fd, "R1R2R3R4", 8);
        p.ctl.sync();
      });
}

SCENARIO(proc_vfork_spawn, 2) {
  run_pair(
      [](Pair& p) {
        int round = 0;
        auto check = [&](const char* after) {
          std::string tag = std::string("after-") + after;
          p.ctl.put(tag.size());
          exchange(p.fd, tag.c_str(), 60 + round++);
        };
        check("nothing");
        pid_t v = vfork();
        if (v == 0) {
          execl("/bin/true", "true", static_cast<char*>(nullptr));
          _exit(127);
        }
        reap(v, "vfork+exec /bin/true");
        check("vfork");
        pid_t s = -1;
        char arg0[] = "true";
        char* argv[] = {arg0, nullptr};
        int r = posix_spawn(&s, "/bin/true", nullptr, nullptr, argv, environ);
        T("posix_spawn = %d", r);
        reap(s, "posix_spawn /bin/true");
        check("posix_spawn");
        int st = system("exit 3");
        T("system(\"exit 3\") = exit %d", WIFEXITED(st) ? WEXITSTATUS(st) : -1);
        check("system");
        pid_t idle = xfork();
        if (idle == 0) _exit(0);  // inherits the connection, touches nothing
        reap(idle, "forked child that exits at once");
        check("idle-child");
        pid_t closer = xfork();
        if (closer == 0) {
          close(p.fd);
          _exit(0);
        }
        reap(closer, "forked child that closes its copy");
        check("closing-child");
        p.ctl.put(0);
      },
      [](Pair& p) { echo_stream_peer(p.fd, p.ctl); });
}

// ---------------------------------------------------------------------------
// execve

// Post-exec client: argv = {fd, ctl fd}. Checks the socket and talks.
EXEC_MODE(exec_client) {
  set_role("client-after-exec");
  int fd = atoi(argv[0]);
  Ctl ctl;
  ctl.fd = atoi(argv[1]);
  struct stat st{};
  fstat(fd, &st);
  sockaddr_in peer{};
  socklen_t len = sizeof peer;
  T("inherited fd is a socket: %s; getpeername = %s", yes(S_ISSOCK(st.st_mode)).c_str(),
    E(getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len)).c_str());
  write_all(fd, "hello-from-exec", 15);
  char buf[16];
  read_exact(fd, buf, 16);
  T("got %s", quote(buf, 16).c_str());
  uint64_t h = send_stream(fd, 70, 300000);
  uint64_t back = recv_stream(fd, 71, 300000);
  T("300000 each way: sent ok %s, received ok %s", yes(h == pattern_sum(70, 300000)).c_str(),
    yes(back == pattern_sum(71, 300000)).c_str());
  ctl.sync();
}

namespace {

// late_inheritable: the client's socket is close-on-exec while it upgrades
// and becomes inheritable only just before the exec, through dup2 (the
// inetd and shell pattern): the new image still needs the segment then.
void exec_inherit(bool warm, bool late_inheritable = false) {
  PairOpts o;
  o.warm = warm;
  if (late_inheritable) o.socket_flags = SOCK_CLOEXEC;
  run_pair(
      [warm](Pair& p) {
        if (warm) {
          write_all(p.fd, "pre", 3);
          char b[3];
          read_exact(p.fd, b, 3);
          T("before the exec: got %s", quote(b, 3).c_str());
        }
        char buf[15];
        read_exact(p.fd, buf, 15);
        T("got %s", quote(buf, 15).c_str());
        write_all(p.fd, "hello-after-exec", 16);
        uint64_t back = recv_stream(p.fd, 70, 300000);
        uint64_t h = send_stream(p.fd, 71, 300000);
        T("300000 each way: received ok %s, sent ok %s", yes(back == pattern_sum(70, 300000)).c_str(),
          yes(h == pattern_sum(71, 300000)).c_str());
        p.ctl.sync();
      },
      [warm, late_inheritable](Pair& p) {
        if (warm) {
          char b[3];
          read_exact(p.fd, b, 3);
          write_all(p.fd, "PRE", 3);
          T("before the exec: got %s", quote(b, 3).c_str());
        }
        int fd = p.fd;
        if (late_inheritable) {
          fd = dup2(p.fd, 40);
          close(p.fd);
        }
        reexec("exec_client", {std::to_string(fd), std::to_string(p.ctl.fd)});
      },
      o);
}

}  // namespace

SCENARIO(proc_exec_inherit, 2) { exec_inherit(true); }
SCENARIO(proc_exec_inherit_cold, 2) { exec_inherit(false); }
SCENARIO(proc_exec_inherit_late, 2) { exec_inherit(true, true); }

// inetd style: the accepted socket becomes stdin and stdout of an exec'd server.
EXEC_MODE(inetd_server) {
  set_role("inetd-server");
  char req[5];
  read_exact(0, req, 5);
  T("stdin gave %s", quote(req, 5).c_str());
  std::vector<char> b(50000);
  fill_pattern(72, 0, b.data(), b.size());
  write_all(1, b.data(), b.size());
  uint64_t sum = 0;
  uint64_t n = read_to_eof(0, &sum);
  T("then read %llu bytes from stdin to EOF, pattern: %s", static_cast<unsigned long long>(n),
    yes(n == 100000 && sum == pattern_sum(73, 100000)).c_str());
  close(0);
  close(1);
}

SCENARIO(proc_exec_inetd, 2) {
  set_role("inetd");
  uint16_t port;
  int lfd = make_listener(&port);
  pid_t client = spawn("client", [&] {
    close(lfd);
    int fd = connect_to(port);
    write_all(fd, "HELLO", 5);
    uint64_t h = recv_stream(fd, 72, 50000);
    T("response ok: %s", yes(h == pattern_sum(72, 50000)).c_str());
    send_stream(fd, 73, 100000);
    shutdown(fd, SHUT_WR);
    char c;
    T("after SHUT_WR: read = %s", E(read(fd, &c, 1)).c_str());
  });
  int fd = accept_one(lfd);
  pid_t server = spawn("inetd-child", [&] {
    dup2(fd, 0);
    dup2(fd, 1);
    close(fd);
    close(lfd);
    reexec("inetd_server", {});
  });
  T("accepted, forked the server, closed our copy = %s", E(close(fd)).c_str());
  reap(server, "inetd-server");
  reap(client, "client");
}

// Socket activation: the listener comes from the process that exec'd us.
EXEC_MODE(activated_server) {
  set_role("activated-server");
  int lfd = atoi(argv[0]);
  Ctl ctl;
  ctl.fd = atoi(argv[1]);
  int acc = -1;
  socklen_t len = sizeof acc;
  getsockopt(lfd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &len);
  T("inherited listener: SO_ACCEPTCONN %d", acc);
  ctl.sync();  // ready
  for (int i = 0; i < 2; ++i) {
    int fd = accept_one(lfd);
    serve_one(fd, "activated-server");
  }
}

SCENARIO_TCP(proc_exec_listener, 2, 2) {
  set_role("activator");
  uint16_t port;
  int lfd = make_listener(&port);
  Ctl mine, its;
  make_ctl(&mine, &its);
  pid_t server = spawn("activated", [&] {
    close(mine.fd);
    reexec("activated_server", {std::to_string(lfd), std::to_string(its.fd)});
  });
  close(its.fd);
  close(lfd);
  mine.sync();
  set_role("client");
  request(port, 1);  // the first connection precedes the server's first accept()
  request(port, 2);
  set_role("activator");
  reap(server, "activated-server");
}
