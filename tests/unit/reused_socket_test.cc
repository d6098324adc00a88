// core/util/reused_socket and the sock_diag queries on it: one socket per
// process out of the program's numbers, reused question after question; a
// second user, a forked child, a program that dup2()ed onto its number, and
// a process with no room for it each get sockets of their own. Each case runs in a
// child: it sets RLIMIT_NOFILE.
#include "util/reused_socket.h"

#include <fcntl.h>
#include <linux/sockios.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "discovery/sockdiag.h"
#include "in_child.h"
#include "loopback_pair.h"
#include "util/fd_budget.h"

namespace rdmashim {
namespace {

using test::in_child;

ino_t inode_of(int fd) {
  struct stat st{};
  return fstat(fd, &st) == 0 ? st.st_ino : 0;
}

bool is_open(int fd) { return fcntl(fd, F_GETFD) >= 0; }

// The socket of a first question, given back: its number and inode.
struct Used {
  int fd = -1;
  ino_t inode = 0;
};
Used first_use(ReusedSocket& s, bool discard = false) {
  ReusedSocket::Lease a = s.lease();
  if (discard) a.discard();
  return {a.fd(), inode_of(a.fd())};
}

int next_number() {
  int fd = eventfd(0, EFD_CLOEXEC);
  close(fd);
  return fd;
}

TEST(ReusedSocket, OneSocketAboveTheSoftLimitServesQuestionAfterQuestion) {
  int r = in_child(64, 256, [] {
    ReusedSocket s(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int bad = 0;
    int before = next_number();
    Used first = first_use(s);
    bad += first.fd < 64;  // out of the program's range
    bad += !fds::is_ours(first.fd);
    bad += !is_open(first.fd);  // kept for the next question
    for (int i = 0; i < 3; ++i) {
      ReusedSocket::Lease b = s.lease();
      bad += b.fd() != first.fd || inode_of(b.fd()) != first.inode;
    }
    bad += next_number() != before;  // the program's numbers are as they were
    return bad;
  });
  EXPECT_EQ(r, 0);
}

TEST(ReusedSocket, ASecondUserGetsASocketOfItsOwnForOneQuestion) {
  int r = in_child(64, 256, [] {
    ReusedSocket s(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int bad = 0;
    ReusedSocket::Lease a = s.lease();
    int own = -1;
    {
      ReusedSocket::Lease b = s.lease();  // as a signal handler in the middle of a's question would
      own = b.fd();
      bad += !b || own == a.fd();
    }
    bad += is_open(own);  // closed with its question
    bad += !is_open(a.fd());
    return bad;
  });
  EXPECT_EQ(r, 0);
}

TEST(ReusedSocket, ADiscardedSocketIsClosedAndReplaced) {
  int r = in_child(64, 256, [] {
    ReusedSocket s(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int bad = 0;
    Used first = first_use(s, true);
    bad += is_open(first.fd);
    bad += fds::is_ours(first.fd);
    ReusedSocket::Lease b = s.lease();
    bad += !b || inode_of(b.fd()) == first.inode;
    return bad;
  });
  EXPECT_EQ(r, 0);
}

TEST(ReusedSocket, TheProgramsDescriptorDup2edOntoOurNumberIsLeftAlone) {
  int r = in_child(64, 256, [] {
    ReusedSocket s(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int bad = 0;
    int fd = first_use(s).fd;
    rlimit lim{256, 256};  // the program raises its limit and takes that number
    setrlimit(RLIMIT_NOFILE, &lim);
    int mine = eventfd(0, EFD_CLOEXEC);
    bad += dup2(mine, fd) != fd;
    ino_t program = inode_of(fd);
    {
      ReusedSocket::Lease b = s.lease();
      bad += !b || b.fd() == fd;
    }
    bad += inode_of(fd) != program;  // still the program's eventfd
    bad += fds::is_ours(fd);
    bad += close(fd) != 0;  // the program's close reaches it
    return bad;
  });
  EXPECT_EQ(r, 0);
}

TEST(ReusedSocket, AForkedChildOpensItsOwnAndLeavesTheParentsAlone) {
  int r = in_child(64, 256, [] {
    ReusedSocket s(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int bad = 0;
    Used first = first_use(s);
    pid_t pid = fork();
    if (pid == 0) {
      int child_bad = 0;
      child_bad += first_use(s).inode == first.inode;
      ReusedSocket::Lease c = s.lease();  // the child's own, reused in turn
      child_bad += !c || fds::is_ours(c.fd()) == false;
      _exit(child_bad);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    bad += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    ReusedSocket::Lease d = s.lease();
    bad += d.fd() != first.fd || inode_of(d.fd()) != first.inode;
    return bad;
  });
  EXPECT_EQ(r, 0);
}

TEST(ReusedSocket, WithoutRoomAboveTheLimitItLivesInTheTopSixteenth) {
  int r = in_child(64, 64, [] {
    ReusedSocket s(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int bad = 0;
    int before = next_number();
    int fd = first_use(s).fd;
    bad += fd < 64 - 8 || fd >= 64;  // the zone: [56, 64), at least 8
    ReusedSocket::Lease b = s.lease();
    bad += b.fd() != fd;
    bad += next_number() != before;
    return bad;
  });
  EXPECT_EQ(r, 0);
}

TEST(ReusedSocket, NoRoomAtAllMeansOneSocketPerQuestion) {
  int r = in_child(16, 16, [] {  // a limit this small is all the program's (fd_budget.h)
    ReusedSocket s(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int bad = 0;
    int before = next_number();
    for (int i = 0; i < 3; ++i) {
      int fd = first_use(s).fd;
      bad += fd < 0;
      bad += is_open(fd);  // nothing of ours stays in the program's range
      bad += fds::is_ours(fd);
    }
    bad += next_number() != before;
    return bad;
  });
  EXPECT_EQ(r, 0);
}

ino_t netns_of_socket(int fd) {
  int ns = ioctl(fd, SIOCGSKNS);
  ino_t ino = ns >= 0 ? inode_of(ns) : 0;
  if (ns >= 0) close(ns);
  return ino;
}

ino_t netns_of_thread() {
  struct stat st{};
  return stat("/proc/thread-self/ns/net", &st) == 0 ? st.st_ino : 0;
}

// As after the setns()/unshare() hooks (preload/hooks_namespace.cc): the
// socket of the old namespace is not used again, and questions are asked on
// sockets opened in the new one.
TEST(ReusedSocket, AfterAMoveToAnotherNetworkNamespaceNothingIsReused) {
  if (geteuid() != 0) GTEST_SKIP() << "unshare(CLONE_NEWNET) needs root";
  int r = in_child(64, 256, [] {
    ReusedSocket s(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    int bad = 0;
    Used first = first_use(s);
    bad += netns_of_socket(first.fd) != netns_of_thread();
    ReusedSocket::stop_after_namespace_move();
    if (unshare(CLONE_NEWNET) != 0) return 77;
    for (int i = 0; i < 2; ++i) {
      ReusedSocket::Lease b = s.lease();
      bad += !b || b.fd() == first.fd;
      bad += netns_of_socket(b.fd()) != netns_of_thread();  // opened in the new namespace
    }
    return bad;
  });
  if (r == 77) GTEST_SKIP() << "unshare(CLONE_NEWNET) failed";
  EXPECT_EQ(r, 0);
}

// The sock_diag questions asked on the reused netlink socket, many times and
// in a forked child, find the right socket every time.
TEST(ReusedSocket, SockDiagQuestionsOnTheReusedSocketAnswerRight) {
  int r = in_child(64, 256, [] {
    int bad = 0;
    test::TcpPair pair;
    int c = pair.client, s = pair.server;
    auto check = [&] {
      int wrong = 0;
      for (int i = 0; i < 50; ++i) {
        discovery::TcpOwner o;
        wrong += !discovery::Diag().tcp_peer_owner(s, &o) || o.inode != inode_of(c) || o.uid != getuid();
        wrong += !discovery::Diag().tcp_peer_owner(c, &o) || o.inode != inode_of(s);
      }
      return wrong;
    };
    bad += check();
    pid_t pid = fork();
    if (pid == 0) _exit(check());
    int status = 0;
    waitpid(pid, &status, 0);
    bad += !WIFEXITED(status) || WEXITSTATUS(status) != 0;
    bad += check();
    return bad;
  });
  EXPECT_EQ(r, 0);
}

}  // namespace
}  // namespace rdmashim
