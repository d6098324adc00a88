#include "shm/segment.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/eventfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "sys/sys.h"
#include "util/fault.h"
#include "util/log.h"

namespace rdmashim::shm {
namespace {

constexpr unsigned kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

bool is_eventfd(int fd) {
  char path[64], target[64];
  snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
  ssize_t n = readlink(path, target, sizeof target - 1);
  if (n <= 0) return false;
  target[n] = '\0';
  return strcmp(target, "anon_inode:[eventfd]") == 0;
}

}  // namespace

std::unique_ptr<Segment> Segment::create(size_t ring_size, int* err) {
  std::unique_ptr<Segment> s(new (std::nothrow) Segment());
  if (!s) {
    *err = -ENOMEM;
    return nullptr;
  }
  s->ring_size_ = ring_size;
  size_t bytes = segment_bytes(ring_size);
  s->memfd_.reset(RDMASHIM_FAULT(kMemfd) ? -1 : memfd_create("rdmashim-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  for (auto& d : s->doorbell_) d.reset(RDMASHIM_FAULT(kEventfd) ? -1 : eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  void* base = MAP_FAILED;
  const char* step = nullptr;  // which call failed, for the debug line
  // Sealed so the peer can never shrink it under us (which would SIGBUS us).
  if (!s->memfd_) step = "memfd_create";
  else if (!s->doorbell_[0] || !s->doorbell_[1]) step = "eventfd";
  else if (RDMASHIM_FAULT(kFtruncate) || ftruncate(s->memfd_.get(), static_cast<off_t>(bytes)) != 0) step = "ftruncate";
  else if (RDMASHIM_FAULT(kSeals) || sys::real().fcntl(s->memfd_.get(), F_ADD_SEALS, kRequiredSeals) != 0) step = "F_ADD_SEALS";
  else if (RDMASHIM_FAULT(kMmap) || (base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd_.get(), 0)) == MAP_FAILED)
    step = "mmap";
  if (step) {
    *err = -(errno ? errno : EIO);
    RDMASHIM_DEBUG("shm segment of %zu bytes: %s failed: %s", bytes, step, strerror(-*err));
    return nullptr;
  }
  s->header_ = new (base) SegmentHeader();
  s->header_->magic = kSegmentMagic;
  s->header_->version = kSegmentVersion;
  s->header_->ring_size = static_cast<uint32_t>(ring_size);
  return s;
}

std::unique_ptr<Segment> Segment::attach(UniqueFd memfd, UniqueFd doorbell_client, UniqueFd doorbell_server,
                                         size_t ring_size, int* err) {
  std::unique_ptr<Segment> s(new (std::nothrow) Segment());
  if (!s) {
    *err = -ENOMEM;
    return nullptr;
  }
  s->ring_size_ = ring_size;
  s->memfd_ = std::move(memfd);
  s->doorbell_[kClient] = std::move(doorbell_client);
  s->doorbell_[kServer] = std::move(doorbell_server);
  size_t bytes = segment_bytes(ring_size);
  struct stat st{};
  int seals = sys::real().fcntl(s->memfd_.get(), F_GET_SEALS);
  bool ok = !RDMASHIM_FAULT(kAttachStat) && fstat(s->memfd_.get(), &st) == 0 && S_ISREG(st.st_mode) &&
            static_cast<size_t>(st.st_size) == bytes && seals >= 0 && !RDMASHIM_FAULT(kAttachSeals) &&
            (static_cast<unsigned>(seals) & kRequiredSeals) == kRequiredSeals &&
            !RDMASHIM_FAULT(kAttachEventfd) && is_eventfd(s->doorbell_[0].get()) && is_eventfd(s->doorbell_[1].get());
  // Our doorbell writes must never block, whatever the creator set.
  ok = ok && !RDMASHIM_FAULT(kAttachNonblock) && sys::real().fcntl(s->doorbell_[0].get(), F_SETFL, O_NONBLOCK) == 0 &&
       sys::real().fcntl(s->doorbell_[1].get(), F_SETFL, O_NONBLOCK) == 0;
  void* base = ok && !RDMASHIM_FAULT(kAttachMmap) ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd_.get(), 0) : MAP_FAILED;
  if (base == MAP_FAILED) {
    *err = ok ? -errno : -EPROTO;
    return nullptr;
  }
  s->header_ = static_cast<SegmentHeader*>(base);
  if (RDMASHIM_FAULT(kAttachHeader) || s->header_->magic != kSegmentMagic || s->header_->version != kSegmentVersion ||
      s->header_->ring_size != ring_size) {
    *err = -EPROTO;
    return nullptr;
  }
  return s;
}

Segment::~Segment() {
  if (header_) munmap(header_, segment_bytes(ring_size_));
}

}  // namespace rdmashim::shm
