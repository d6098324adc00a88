#include "util/reused_socket.h"

#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "sys/sys.h"
#include "util/fd_budget.h"
#include "util/process.h"
#include "util/unique_fd.h"

namespace rdmashim {

ReusedSocket::Lease::~Lease() {
  if (fd_ < 0) return;
  if (from_) {
    from_->give_back(discarded_);
  } else {
    fds::close(fd_);
  }
}

namespace {

std::atomic<bool> g_namespace_moved{false};

}  // namespace

void ReusedSocket::stop_after_namespace_move() { g_namespace_moved.store(true, std::memory_order_relaxed); }

bool ReusedSocket::still_ours(pid_t self) {
  if (fd_ < 0) return false;
  if (owner_ != self) {
    fds::close(fd_);  // the parent's, inherited across fork: this copy is ours to close
    fd_ = -1;
    return false;
  }
  struct stat st{};
  if (fstat(fd_, &st) == 0 && S_ISSOCK(st.st_mode) && st.st_ino == inode_) return true;
  fds::disown(fd_);  // the program's descriptor now (or none): never touch it
  fd_ = -1;
  return false;
}

ReusedSocket::Lease ReusedSocket::lease() {
  int saved = errno;
  const auto& sys = sys::real();
  // Under a seccomp filter nothing is reused (the calls stay the ones made
  // before there was reuse: socket, the question, close), nor once a thread
  // moved to another network namespace (see the header); one opened before
  // stays unused.
  const bool reuse = sandbox() == Sandbox::kNone && !g_namespace_moved.load(std::memory_order_relaxed);
  if (reuse && !busy_.exchange(true, std::memory_order_acquire)) {
    const pid_t self = getpid();
    if (!still_ours(self) && gave_up_in_ != self) {
      UniqueFd fresh(sys.socket(domain_, type_, protocol_));
      struct stat st{};
      // Out of the program's numbers like every descriptor we keep. Where
      // there is no room for it, each question has a socket of its own.
      if (fresh && fstat(fresh.get(), &st) == 0) {
        if (fds::keep(fresh)) {
          fd_ = fresh.release();
          inode_ = st.st_ino;
          owner_ = self;
        } else {
          gave_up_in_ = self;
        }
      }
    }
    if (fd_ >= 0) {
      errno = saved;
      return Lease(fd_, this);
    }
    busy_.store(false, std::memory_order_release);
  }
  Lease own(sys.socket(domain_, type_, protocol_), nullptr);
  errno = saved;
  return own;
}

void ReusedSocket::give_back(bool discard) {
  if (discard) {
    fds::close(fd_);
    fd_ = -1;
  }
  busy_.store(false, std::memory_order_release);
}

}  // namespace rdmashim
