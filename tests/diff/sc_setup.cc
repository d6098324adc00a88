// Connection setups programs really use: IPv6 loopback, a dual-stack [::]
// listener reached over IPv4, wildcard listeners, connecting to the host's own
// non-loopback address, a client that binds first, SO_REUSEPORT listeners.
#include <ifaddrs.h>
#include <net/if.h>

#include "sc_common.h"

using namespace diff;

namespace {

// 200 KB each way, both checked; then the server closes and the client sees EOF.
void talk_server(int fd) {
  uint64_t got = recv_stream(fd, 40, 200000);
  uint64_t sent = send_stream(fd, 41, 200000);
  T("200000 each way: received ok %s, sent ok %s", yes(got == pattern_sum(40, 200000)).c_str(),
    yes(sent == pattern_sum(41, 200000)).c_str());
  close(fd);
}
void talk_client(int fd) {
  uint64_t sent = send_stream(fd, 40, 200000);
  uint64_t got = recv_stream(fd, 41, 200000);
  char c;
  auto r = E(read(fd, &c, 1));
  T("200000 each way: sent ok %s, received ok %s; then read = %s", yes(sent == pattern_sum(40, 200000)).c_str(),
    yes(got == pattern_sum(41, 200000)).c_str(), r.c_str());
  close(fd);
}

// A listener on `addr` (family-specific sockaddr), port chosen by the kernel.
int listen_on(const sockaddr* addr, socklen_t len, uint16_t* port) {
  int fd = socket(addr->sa_family, SOCK_STREAM, 0);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (bind(fd, addr, len) != 0) fatal("bind: %s", ename(errno));
  if (listen(fd, 16) != 0) fatal("listen: %s", ename(errno));
  sockaddr_storage ss{};
  socklen_t sl = sizeof ss;
  getsockname(fd, reinterpret_cast<sockaddr*>(&ss), &sl);
  *port = ntohs(ss.ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6*>(&ss)->sin6_port
                                         : reinterpret_cast<sockaddr_in*>(&ss)->sin_port);
  return fd;
}

int connect_addr(sockaddr* addr, socklen_t len) {
  int fd = socket(addr->sa_family, SOCK_STREAM, 0);
  if (connect(fd, addr, len) != 0) fatal("connect: %s", ename(errno));
  return fd;
}

sockaddr_in v4(uint32_t host_order_addr, uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(host_order_addr);
  a.sin_port = htons(port);
  return a;
}

sockaddr_in6 v6(const in6_addr& addr, uint16_t port) {
  sockaddr_in6 a{};
  a.sin6_family = AF_INET6;
  a.sin6_addr = addr;
  a.sin6_port = htons(port);
  return a;
}

// The standard shape with a custom listener and a custom connect.
void setup_pair(const std::function<int(uint16_t*)>& make_listen, const std::function<int(uint16_t)>& make_conn,
                const std::function<void(int)>& server_extra = nullptr) {
  set_role("server");
  uint16_t port;
  int lfd = make_listen(&port);
  pid_t kid = spawn("client", [&] {
    close(lfd);
    int fd = make_conn(port);
    talk_client(fd);
  });
  int fd = accept_one(lfd);
  if (server_extra) server_extra(fd);
  talk_server(fd);
  reap(kid, "client");
}

}  // namespace

SCENARIO(addr_ipv6_loopback, 2) {
  setup_pair(
      [](uint16_t* port) {
        sockaddr_in6 a = v6(in6addr_loopback, 0);
        return listen_on(reinterpret_cast<sockaddr*>(&a), sizeof a, port);
      },
      [](uint16_t port) {
        sockaddr_in6 a = v6(in6addr_loopback, port);
        return connect_addr(reinterpret_cast<sockaddr*>(&a), sizeof a);
      },
      [](int fd) {
        sockaddr_in6 peer{};
        socklen_t len = sizeof peer;
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len);
        T("peer family AF_INET6: %s, ::1: %s", yes(peer.sin6_family == AF_INET6).c_str(),
          yes(IN6_IS_ADDR_LOOPBACK(&peer.sin6_addr)).c_str());
      });
}

SCENARIO(addr_dualstack_v4_client, 2) {
  setup_pair(
      [](uint16_t* port) {
        sockaddr_in6 a = v6(in6addr_any, 0);
        return listen_on(reinterpret_cast<sockaddr*>(&a), sizeof a, port);
      },
      [](uint16_t port) {
        sockaddr_in a = v4(INADDR_LOOPBACK, port);
        return connect_addr(reinterpret_cast<sockaddr*>(&a), sizeof a);
      },
      [](int fd) {
        sockaddr_in6 peer{};
        socklen_t len = sizeof peer;
        getpeername(fd, reinterpret_cast<sockaddr*>(&peer), &len);
        T("[::] listener, IPv4 client: peer is v4-mapped: %s", yes(IN6_IS_ADDR_V4MAPPED(&peer.sin6_addr)).c_str());
      });
}

SCENARIO(addr_wildcard_v4, 2) {
  setup_pair(
      [](uint16_t* port) {
        sockaddr_in a = v4(INADDR_ANY, 0);
        return listen_on(reinterpret_cast<sockaddr*>(&a), sizeof a, port);
      },
      [](uint16_t port) {
        sockaddr_in a = v4(INADDR_LOOPBACK, port);
        return connect_addr(reinterpret_cast<sockaddr*>(&a), sizeof a);
      });
}

SCENARIO(addr_own_interface_ip, 2) {
  // Connect to the host's first non-loopback IPv4 address (127.0.0.1 if none).
  setup_pair(
      [](uint16_t* port) {
        sockaddr_in a = v4(INADDR_ANY, 0);
        return listen_on(reinterpret_cast<sockaddr*>(&a), sizeof a, port);
      },
      [](uint16_t port) {
        uint32_t addr = INADDR_LOOPBACK;
        ifaddrs* ifs = nullptr;
        if (getifaddrs(&ifs) == 0) {
          for (ifaddrs* i = ifs; i; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET || (i->ifa_flags & IFF_LOOPBACK)) continue;
            addr = ntohl(reinterpret_cast<sockaddr_in*>(i->ifa_addr)->sin_addr.s_addr);
            break;
          }
          freeifaddrs(ifs);
        }
        sockaddr_in a = v4(addr, port);
        return connect_addr(reinterpret_cast<sockaddr*>(&a), sizeof a);
      });
}

SCENARIO(addr_client_binds_first, 2) {
  setup_pair(
      [](uint16_t* port) {
        sockaddr_in a = v4(INADDR_LOOPBACK, 0);
        return listen_on(reinterpret_cast<sockaddr*>(&a), sizeof a, port);
      },
      [](uint16_t port) {
        int fd = socket(AF_INET, SOCK_STREAM, 0);
        sockaddr_in self = v4(INADDR_LOOPBACK, 0);
        T("bind before connect = %s", E(bind(fd, reinterpret_cast<sockaddr*>(&self), sizeof self)).c_str());
        sockaddr_in a = v4(INADDR_LOOPBACK, port);
        T("connect = %s", E(connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a)).c_str());
        return fd;
      });
}

SCENARIO(addr_reuseport_listeners, 8) {
  // Two SO_REUSEPORT listeners on one port; the kernel spreads 4 connections.
  set_role("server");
  auto make = [](uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEPORT, &one, sizeof one);
    sockaddr_in a = v4(INADDR_LOOPBACK, port);
    if (bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0) fatal("bind: %s", ename(errno));
    listen(fd, 16);
    return fd;
  };
  int l1 = make(0);
  sockaddr_in a{};
  socklen_t len = sizeof a;
  getsockname(l1, reinterpret_cast<sockaddr*>(&a), &len);
  uint16_t port = ntohs(a.sin_port);
  int l2 = make(port);
  pid_t kid = spawn("client", [&] {
    close(l1);
    close(l2);
    for (int i = 0; i < 4; ++i) {
      int fd = connect_to(port);
      uint64_t got = recv_stream(fd, 42, 50000);
      T("connection %d: got the greeting intact: %s", i, yes(got == pattern_sum(42, 50000)).c_str());
      close(fd);
    }
  });
  int served = 0;
  while (served < 4) {
    pollfd pf[2] = {{l1, POLLIN, 0}, {l2, POLLIN, 0}};
    if (poll(pf, 2, kBoundMs) <= 0) break;
    for (auto& p : pf) {
      if (!(p.revents & POLLIN)) continue;
      int fd = accept(p.fd, nullptr, nullptr);
      if (fd < 0) continue;
      send_stream(fd, 42, 50000);
      close(fd);
      served++;
    }
  }
  T("served %d connections from the two listeners", served);
  reap(kid, "client");
}
