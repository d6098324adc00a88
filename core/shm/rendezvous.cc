#include "shm/rendezvous.h"

#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstring>

#include "util/misc.h"

namespace rdmashim::shm {
namespace {

socklen_t make_address(const unsigned char (&name)[kNameBytes], sockaddr_un* addr) {
  static const char kHex[] = "0123456789abcdef";
  static const char kPrefix[] = "rdmashim-rv-";
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  char* p = addr->sun_path + 1;  // leading NUL: abstract namespace
  memcpy(p, kPrefix, sizeof kPrefix - 1);
  p += sizeof kPrefix - 1;
  for (unsigned char b : name) {
    *p++ = kHex[b >> 4];
    *p++ = kHex[b & 15];
  }
  return static_cast<socklen_t>(p - reinterpret_cast<char*>(addr));
}

// One handover message: the token as its payload, room for the descriptors.
struct Handoff {
  unsigned char payload[kTokenBytes];
  iovec iov{payload, sizeof payload};
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kHandoffFds)] = {};
  msghdr msg{};
  Handoff() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
  }
  Handoff(const Handoff&) = delete;
};

}  // namespace

UniqueFd open_rendezvous(unsigned char (&name)[kNameBytes]) {
  if (!random_bytes(name, sizeof name)) return UniqueFd();
  const auto& sys = sys::real();
  UniqueFd fd(sys.socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  sockaddr_un addr;
  socklen_t len = make_address(name, &addr);
  if (sys.bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0 || sys.listen(fd.get(), 4) != 0) {
    return UniqueFd();
  }
  return fd;
}

int send_descriptors(const unsigned char (&name)[kNameBytes], const unsigned char (&token)[kTokenBytes],
                     const int (&fds)[kHandoffFds]) {
  const auto& sys = sys::real();
  UniqueFd fd(sys.socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return -errno;
  sockaddr_un addr;
  socklen_t len = make_address(name, &addr);
  // A unix connect completes at once when the listener's backlog has room.
  if (sys.connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) return -errno;

  Handoff h;
  memcpy(h.payload, token, sizeof h.payload);
  cmsghdr* c = CMSG_FIRSTHDR(&h.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * kHandoffFds);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * kHandoffFds);
  ssize_t n = sys.sendmsg(fd.get(), &h.msg, MSG_NOSIGNAL);
  if (n != static_cast<ssize_t>(sizeof h.payload)) return n < 0 ? -errno : -EIO;
  return 0;
}

int receive_descriptors(int listener, const unsigned char (&token)[kTokenBytes], UniqueFd (&out)[kHandoffFds]) {
  const auto& sys = sys::real();
  // A few stray connections (someone who read the name from /proc/net/unix)
  // are skipped; the backlog is tiny, so this loop is short.
  for (int attempt = 0; attempt < 8; ++attempt) {
    UniqueFd conn(sys.accept4(listener, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC));
    if (!conn) return errno == EAGAIN || errno == EWOULDBLOCK ? -ETIMEDOUT : -errno;
    Handoff h;
    ssize_t n = sys.recvmsg(conn.get(), &h.msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    UniqueFd got[kHandoffFds];
    int count = 0;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h.msg); c; c = CMSG_NXTHDR(&h.msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfds; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (count < kHandoffFds) got[count++].reset(fd);
        else sys.close(fd);  // more than we asked for: never keep strays
      }
    }
    bool truncated = (h.msg.msg_flags & MSG_CTRUNC) != 0;
    if (n == static_cast<ssize_t>(sizeof h.payload) && !truncated && count == kHandoffFds &&
        memcmp(h.payload, token, sizeof h.payload) == 0) {
      for (int i = 0; i < kHandoffFds; ++i) out[i] = std::move(got[i]);
      return 0;
    }
  }
  return -EPROTO;
}

}  // namespace rdmashim::shm
