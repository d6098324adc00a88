#include "shm/local_state.h"

#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <new>

#include "shm/segment.h"
#include "util/fault.h"
#include "util/fd_budget.h"

namespace rdmashim::shm {

bool LocalPage::map(int* err) {
  void* base = mmap(nullptr, kLocalBytes, PROT_READ | PROT_WRITE, MAP_SHARED, fd_.get(), 0);
  if (base == MAP_FAILED) {
    *err = -errno;
    return false;
  }
  state_ = static_cast<LocalState*>(base);
  return true;
}

std::unique_ptr<LocalPage> LocalPage::create(int* err) {
  std::unique_ptr<LocalPage> p(new (std::nothrow) LocalPage());
  if (!p) {
    *err = -ENOMEM;
    return nullptr;
  }
  p->fd_.reset(RDMASHIM_FAULT(kLocalPage) ? -1 : memfd_create("rdmashim-local", MFD_CLOEXEC));
  if (p->fd_ && !fds::keep(p->fd_)) {  // out of the program's numbers, or no room
    *err = -EMFILE;
    return nullptr;
  }
  if (!p->fd_ || ftruncate(p->fd_.get(), kLocalBytes) != 0) {
    *err = -(errno ? errno : EIO);
    if (!p->fd_ && fds::exhausted(*err)) *err = -EMFILE;
    return nullptr;
  }
  if (!p->map(err)) return nullptr;
  new (p->state_) LocalState();
  p->state_->magic = kLocalMagic;
  return p;
}

std::unique_ptr<LocalPage> LocalPage::adopt(UniqueFd fd, int* err) {
  std::unique_ptr<LocalPage> p(new (std::nothrow) LocalPage());
  if (!p) {
    *err = -ENOMEM;
    return nullptr;
  }
  p->fd_ = std::move(fd);
  struct stat st{};
  if (fstat(p->fd_.get(), &st) != 0 || !S_ISREG(st.st_mode) || static_cast<size_t>(st.st_size) != kLocalBytes) {
    *err = -EPROTO;
    return nullptr;
  }
  if (!p->map(err)) return nullptr;
  if (p->state_->magic != kLocalMagic) {
    *err = -EPROTO;
    return nullptr;
  }
  return p;
}

void LocalPage::close_fd() {
  UniqueFd probe(open_own_mapping(state_, kLocalBytes));
  if (probe) fd_.reset();
}

int LocalPage::reopen_fd() {
  if (!fd_) {
    fd_.reset(open_own_mapping(state_, kLocalBytes));
    if (fd_) fds::keep(fd_);
  }
  return fd_.get();
}

LocalPage::~LocalPage() {
  if (state_) munmap(state_, kLocalBytes);
}

}  // namespace rdmashim::shm
