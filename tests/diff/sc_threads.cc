// Threads: full-duplex use of one socket by two threads, many sockets in
// many threads, and signals interrupting blocking calls (SA_RESTART or not,
// a pthread_kill at a known moment, and a 1 kHz timer during bulk I/O).
#include <time.h>

#include <thread>

#include "sc_common.h"

using namespace diff;

SCENARIO(thr_full_duplex, 2) {
  auto body = [](Pair& p, uint64_t out_seed, uint64_t in_seed) {
    const uint64_t size = 16u << 20;
    uint64_t sent = 0, got = 0;
    std::thread tx([&] { sent = send_stream(p.fd, out_seed, size); });
    std::thread rx([&] { got = recv_stream(p.fd, in_seed, size); });
    tx.join();
    rx.join();
    T("16 MiB each way at once, two threads: sent ok %s, received ok %s",
      yes(sent == pattern_sum(out_seed, size)).c_str(), yes(got == pattern_sum(in_seed, size)).c_str());
    p.ctl.sync();
  };
  run_pair([&](Pair& p) { body(p, 80, 81); }, [&](Pair& p) { body(p, 81, 80); });
}

SCENARIO(thr_many_sockets, 64) {
  constexpr int kThreads = 8, kPer = 4, kBytes = 100000;
  set_role("server");
  uint16_t port;
  int lfd = make_listener(&port, 0, 128);
  pid_t client = spawn("client", [&] {
    close(lfd);
    std::vector<std::thread> ts;
    for (int t = 0; t < kThreads; ++t) {
      ts.emplace_back([&, t] {
        set_role("client.t" + std::to_string(t));
        int fds[kPer];
        for (int i = 0; i < kPer; ++i) fds[i] = connect_to(port);
        for (int i = 0; i < kPer; ++i) {
          uint64_t id = static_cast<uint64_t>(t * kPer + i);
          write_all(fds[i], &id, 8);
          send_stream(fds[i], 1000 + id, kBytes);
        }
        int ok = 0;
        for (int i = 0; i < kPer; ++i) {
          uint64_t id = static_cast<uint64_t>(t * kPer + i);
          ok += recv_stream(fds[i], 2000 + id, kBytes) == pattern_sum(2000 + id, kBytes);
          close(fds[i]);
        }
        T("%d of %d connections ok", ok, kPer);
      });
    }
    for (auto& t : ts) t.join();
  });
  std::atomic<int> ok{0};
  std::vector<std::thread> ts;
  for (int i = 0; i < kThreads * kPer; ++i) {
    int fd = accept_one(lfd);
    ts.emplace_back([&, fd] {
      uint64_t id = 0;
      read_exact(fd, &id, 8);
      bool good = recv_stream(fd, 1000 + id, kBytes) == pattern_sum(1000 + id, kBytes);
      send_stream(fd, 2000 + id, kBytes);
      char c;
      good = good && read(fd, &c, 1) == 0;  // the client closes after reading
      close(fd);
      ok += good;
    });
  }
  for (auto& t : ts) t.join();
  T("%d of %d connections ok (one thread each)", ok.load(), kThreads * kPer);
  reap(client, "client");
}

namespace {

// A blocking call in the main thread is hit by SIGUSR1 while it sleeps;
// then the peer sends. `call` runs the blocking call and returns its result.
void interrupted(bool restart, const std::function<std::string(Pair&)>& call) {
  run_pair(
      [&](Pair& p) {
        install_counter(SIGUSR1, restart);
        sig_count(SIGUSR1) = 0;
        pthread_t self = pthread_self();
        pid_t me = tid();
        std::thread helper([&] {
          until_sleeping(me);
          pthread_kill(self, SIGUSR1);
          sleep_ms(50);
          p.ctl.sync();  // now the client sends
        });
        std::string r = call(p);
        T("blocking call hit by a signal %s SA_RESTART = %s; handler ran: %s", restart ? "with" : "without",
          r.c_str(), yes(sig_count(SIGUSR1) == 1).c_str());
        helper.join();
        if (r.find("hello") == std::string::npos) {  // the data is still to be read
          char buf[16];
          ssize_t n = recv(p.fd, buf, sizeof buf, 0);
          T("then recv = %s", Rn(n, buf).c_str());
        }
        p.ctl.sync();
      },
      [](Pair& p) {
        p.ctl.sync();
        write_all(p.fd, "hello", 5);
        p.ctl.sync();
      });
}

std::string do_recv(Pair& p) {
  char buf[16];
  ssize_t n = recv(p.fd, buf, sizeof buf, 0);
  std::string r = E(n);
  if (n > 0) r += " " + quote(buf, static_cast<size_t>(n));
  return r;
}

std::string do_poll(Pair& p) {
  pollfd pf{p.fd, POLLIN, 0};
  int k = poll(&pf, 1, kBoundMs);
  return pres(k, pf);
}

std::string do_epoll(Pair& p) {
  int ep = epoll_create1(0);
  epoll_add(ep, p.fd, EPOLLIN, 0x5151);
  epoll_event ev[2];
  int k = epoll_wait(ep, ev, 2, kBoundMs);
  std::string r = evs(k, ev);
  close(ep);
  return r;
}

}  // namespace

SCENARIO(thr_signal_recv_restart, 2) { interrupted(true, do_recv); }
SCENARIO(thr_signal_recv_eintr, 2) { interrupted(false, do_recv); }
// poll and epoll_wait are never restarted, SA_RESTART or not.
SCENARIO(thr_signal_poll_eintr, 2) { interrupted(true, do_poll); }
SCENARIO(thr_signal_epoll_eintr, 2) { interrupted(true, do_epoll); }

namespace {

void timer_storm(bool restart) {
  auto body = [restart](Pair& p, uint64_t out_seed, uint64_t in_seed) {
    install_counter(SIGUSR2, restart);
    sig_count(SIGUSR2) = 0;
    timer_t timer;
    sigevent sev{};
    sev.sigev_notify = SIGEV_SIGNAL;
    sev.sigev_signo = SIGUSR2;
    timer_create(CLOCK_MONOTONIC, &sev, &timer);
    itimerspec its{{0, 1000000}, {0, 1000000}};  // every millisecond
    timer_settime(timer, 0, &its, nullptr);
    const uint64_t size = 4u << 20;
    uint64_t sent = 0, got = 0;
    // The helpers retry EINTR the way careful programs do.
    std::thread tx([&] { sent = send_stream(p.fd, out_seed, size); });
    got = recv_stream(p.fd, in_seed, size);
    tx.join();
    itimerspec off{};
    timer_settime(timer, 0, &off, nullptr);
    T("4 MiB each way under a 1 kHz timer signal (%s SA_RESTART): sent ok %s, received ok %s, signals seen: %s",
      restart ? "with" : "without", yes(sent == pattern_sum(out_seed, size)).c_str(),
      yes(got == pattern_sum(in_seed, size)).c_str(), yes(sig_count(SIGUSR2) > 0).c_str());
    p.ctl.sync();
  };
  run_pair([&](Pair& p) { body(p, 90, 91); }, [&](Pair& p) { body(p, 91, 90); });
}

}  // namespace

SCENARIO(thr_timer_signal_restart, 2) { timer_storm(true); }
SCENARIO(thr_timer_signal_eintr, 2) { timer_storm(false); }
