#include "shm/rendezvous.h"

#include <linux/filter.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cerrno>
#include <cstddef>
#include <cstring>

#include "util/fault.h"
#include "util/fd_budget.h"
#include "util/log.h"
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

// One handover datagram: nonce and token as its payload, room for the
// descriptors and the sender's credentials.
//  0  nonce[16]  the Hello's nonce (what the client's socket filter checks)
// 16  token[16]  the Ack's token
struct Handoff {
  unsigned char payload[kNonceBytes + kTokenBytes];
  iovec iov{payload, sizeof payload};
  sockaddr_un from{};  // the sender's address: the server's doorbell
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * kHandoffFds) + CMSG_SPACE(sizeof(ucred))] = {};
  msghdr msg{};
  Handoff() {
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    msg.msg_name = &from;
    msg.msg_namelen = sizeof from;
  }
  Handoff(const Handoff&) = delete;
};

// Accepts (whole) only datagrams whose first 16 bytes are `nonce`; a shorter
// one fails the load and is dropped too.
bool attach_nonce_filter(int fd, const unsigned char (&nonce)[kNonceBytes]) {
  sock_filter code[10];
  int n = 0;
  for (int w = 0; w < 4; ++w) {
    const unsigned char* b = nonce + 4 * w;
    uint32_t word = uint32_t{b[0]} << 24 | uint32_t{b[1]} << 16 | uint32_t{b[2]} << 8 | b[3];  // loads are big-endian
    code[n++] = BPF_STMT(BPF_LD | BPF_W | BPF_ABS, static_cast<uint32_t>(4 * w));
    code[n++] = BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, word, 0, static_cast<uint8_t>(7 - 2 * w));
  }
  code[n++] = BPF_STMT(BPF_RET | BPF_K, 0xFFFFFFFFu);
  code[n++] = BPF_STMT(BPF_RET | BPF_K, 0);
  sock_fprog prog{static_cast<unsigned short>(n), code};
  return !RDMASHIM_FAULT(kRendezvousFilter) && sys::real().setsockopt(fd, SOL_SOCKET, SO_ATTACH_FILTER, &prog, sizeof prog) == 0;
}

}  // namespace

UniqueFd open_rendezvous(unsigned char (&name)[kNameBytes], const unsigned char (&nonce)[kNonceBytes]) {
  if (RDMASHIM_FAULT(kRandom) || !random_bytes(name, sizeof name)) return UniqueFd();
  const auto& sys = sys::real();
  UniqueFd fd(RDMASHIM_FAULT(kRendezvousSocket) ? -1 : sys.socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return fd;
  sockaddr_un addr;
  socklen_t len = make_address(name, &addr);
  int on = 1;
  // The filter first: nothing may be queued before it is in place.
  if (!attach_nonce_filter(fd.get(), nonce) ||
      RDMASHIM_FAULT(kRendezvousPasscred) || sys.setsockopt(fd.get(), SOL_SOCKET, SO_PASSCRED, &on, sizeof on) != 0 ||
      RDMASHIM_FAULT(kRendezvousBind) || sys.bind(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0) {
    return UniqueFd();
  }
  return fd;
}

int send_descriptors(const unsigned char (&name)[kNameBytes], const unsigned char (&nonce)[kNonceBytes],
                     const unsigned char (&token)[kTokenBytes], const int (&fds)[kHandoffFds],
                     UniqueFd* doorbell) {
  const auto& sys = sys::real();
  UniqueFd fd(RDMASHIM_FAULT(kHandoffSocket) ? -1 : sys.socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  sockaddr_un addr;
  socklen_t len = make_address(name, &addr);
  // Bound (an autobind name) so the client can connect back; connected, so
  // only the client's socket can send to it.
  sa_family_t unnamed = AF_UNIX;
  // Long-lived (it becomes our doorbell): out of the program's numbers.
  if (fd && !rdmashim::fds::keep(fd)) errno = EMFILE;
  const char* step = !fd ? "socket (or moving it out of the program's way)"
                     : RDMASHIM_FAULT(kHandoffConnect) ||
                             sys.bind(fd.get(), reinterpret_cast<sockaddr*>(&unnamed), sizeof unnamed) != 0
                         ? "bind"
                     : sys.connect(fd.get(), reinterpret_cast<sockaddr*>(&addr), len) != 0            ? "connect"
                                                                                                       : nullptr;
  if (step) {
    int err = -errno;
    RDMASHIM_DEBUG("shm handover: %s failed: %s", step, strerror(-err));
    return err;
  }
  Handoff h;
  h.msg.msg_name = nullptr;
  h.msg.msg_namelen = 0;
  memcpy(h.payload, nonce, kNonceBytes);
  memcpy(h.payload + kNonceBytes, token, kTokenBytes);
  h.msg.msg_controllen = CMSG_SPACE(sizeof(int) * kHandoffFds);
  cmsghdr* c = CMSG_FIRSTHDR(&h.msg);
  c->cmsg_level = SOL_SOCKET;
  c->cmsg_type = SCM_RIGHTS;
  c->cmsg_len = CMSG_LEN(sizeof(int) * kHandoffFds);
  memcpy(CMSG_DATA(c), fds, sizeof(int) * kHandoffFds);
  // Never blocks: filtered datagrams are dropped before the receiver's queue
  // (max_dgram_qlen) is counted, so EAGAIN needs a flood that bears the nonce.
  ssize_t n = RDMASHIM_FAULT(kHandoffSend) ? -1 : sys.sendmsg(fd.get(), &h.msg, MSG_NOSIGNAL | MSG_DONTWAIT);
  if (n != static_cast<ssize_t>(sizeof h.payload)) {
    int err = n < 0 ? -errno : -EIO;
    RDMASHIM_DEBUG("shm handover: sendmsg to the client's rendezvous failed: %s", strerror(-err));
    return err;
  }
  *doorbell = std::move(fd);
  return 0;
}

void send_refusal(const unsigned char (&name)[kNameBytes], const unsigned char (&nonce)[kNonceBytes]) {
  const auto& sys = sys::real();
  UniqueFd fd(sys.socket(AF_UNIX, SOCK_DGRAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0));
  if (!fd) return;
  sockaddr_un addr;
  socklen_t len = make_address(name, &addr);
  if (sys.sendto(fd.get(), nonce, kNonceBytes, MSG_NOSIGNAL | MSG_DONTWAIT, reinterpret_cast<sockaddr*>(&addr), len) < 0) {
    RDMASHIM_DEBUG("shm refusal: sendto the client's rendezvous failed: %s", strerror(errno));
  }
}

int take_refusal(int socket) {
  const auto& sys = sys::real();
  for (;;) {
    Handoff h;
    ssize_t n = sys.recvmsg(socket, &h.msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : -errno;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h.msg); c; c = CMSG_NXTHDR(&h.msg, c)) {
      if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
      size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfds; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        sys.close(fd);  // a handover: an Ack follows, and nobody maps it now
      }
    }
    if (n == static_cast<ssize_t>(kNonceBytes)) return 1;  // the filter checked the nonce
  }
}

namespace {

// The rendezvous socket becomes the client's doorbell: connected to the
// server's, it takes datagrams from that socket alone, so the nonce filter
// and the credentials have done their work.
int connect_doorbell(int socket, const Handoff& h) {
  const auto& sys = sys::real();
  socklen_t len = h.msg.msg_namelen;
  if (len <= offsetof(sockaddr_un, sun_path) || len > sizeof h.from || h.from.sun_family != AF_UNIX) return -EPROTO;
  int off = 0, unused = 0;
  sys.setsockopt(socket, SOL_SOCKET, SO_PASSCRED, &off, sizeof off);
  if (RDMASHIM_FAULT(kDoorbellConnect) || sys.connect(socket, reinterpret_cast<const sockaddr*>(&h.from), len) != 0) {
    // The server already closed its end (a banner and close): nothing will
    // ring us, and the filter keeps everyone else out.
    return errno == ECONNREFUSED ? 0 : -errno;
  }
  sys.setsockopt(socket, SOL_SOCKET, SO_DETACH_FILTER, &unused, sizeof unused);
  return 0;
}

}  // namespace

int receive_descriptors(int socket, const unsigned char (&nonce)[kNonceBytes],
                        const unsigned char (&token)[kTokenBytes], uid_t sender_uid, UniqueFd (&out)[kHandoffFds]) {
  const auto& sys = sys::real();
  int result = -ETIMEDOUT;  // nothing (more) queued
  // Only datagrams with the nonce get past the filter: the server's, or one
  // sent by someone who could read our TCP stream. A few are plenty.
  for (int attempt = 0; attempt < 4; ++attempt) {
    Handoff h;
    ssize_t n = RDMASHIM_FAULT(kHandoffRecv) ? -1 : sys.recvmsg(socket, &h.msg, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
    if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK ? result : -errno;
    UniqueFd got[kHandoffFds];
    int count = 0;
    bool from_owner = false;
    for (cmsghdr* c = CMSG_FIRSTHDR(&h.msg); c; c = CMSG_NXTHDR(&h.msg, c)) {
      if (c->cmsg_level != SOL_SOCKET) continue;
      if (c->cmsg_type == SCM_CREDENTIALS && c->cmsg_len >= CMSG_LEN(sizeof(ucred))) {
        ucred cred;
        memcpy(&cred, CMSG_DATA(c), sizeof cred);
        from_owner = cred.uid == sender_uid;
      }
      if (c->cmsg_type != SCM_RIGHTS) continue;
      size_t nfds = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
      for (size_t i = 0; i < nfds; ++i) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (count < kHandoffFds) got[count++].reset(fd);
        else sys.close(fd);  // more than we asked for: never keep strays
      }
    }
    bool truncated = (h.msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0;
    bool proof = n == static_cast<ssize_t>(sizeof h.payload) && memcmp(h.payload, nonce, kNonceBytes) == 0 &&
                 memcmp(h.payload + kNonceBytes, token, kTokenBytes) == 0;
    if (proof && !from_owner) result = -EACCES;
    // No free descriptor number for them here: the kernel dropped them.
    if (proof && from_owner && (h.msg.msg_flags & MSG_CTRUNC) && count < kHandoffFds) return -EMFILE;
    if (proof && from_owner && !truncated && count == kHandoffFds) {
      int err = connect_doorbell(socket, h);
      if (err != 0) return err;
      for (int i = 0; i < kHandoffFds; ++i) out[i] = std::move(got[i]);
      return 0;
    }
    if (result == -ETIMEDOUT) result = -EPROTO;
  }
  return result;
}

}  // namespace rdmashim::shm
