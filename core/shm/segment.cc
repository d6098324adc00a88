#include "shm/segment.h"

#include <fcntl.h>
#include <linux/memfd.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <new>

#include "sys/sys.h"
#include "util/log.h"

namespace rdmashim::shm {
namespace {

constexpr unsigned kRequiredSeals = F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL;

}  // namespace

std::unique_ptr<Segment> Segment::create(size_t ring_size, int* err) {
  std::unique_ptr<Segment> s(new (std::nothrow) Segment());
  if (!s) {
    *err = -ENOMEM;
    return nullptr;
  }
  s->ring_size_ = ring_size;
  size_t bytes = segment_bytes(ring_size);
  s->memfd_.reset(memfd_create("rdmashim-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  void* base = MAP_FAILED;
  const char* step = nullptr;  // which call failed, for the debug line
  // Sealed so the peer can never shrink it under us (which would SIGBUS us).
  if (!s->memfd_) step = "memfd_create";
  else if (ftruncate(s->memfd_.get(), static_cast<off_t>(bytes)) != 0) step = "ftruncate";
  else if (sys::real().fcntl(s->memfd_.get(), F_ADD_SEALS, kRequiredSeals) != 0) step = "F_ADD_SEALS";
  else if ((base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd_.get(), 0)) == MAP_FAILED)
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

std::unique_ptr<Segment> Segment::attach(UniqueFd memfd, size_t ring_size, int* err) {
  std::unique_ptr<Segment> s(new (std::nothrow) Segment());
  if (!s) {
    *err = -ENOMEM;
    return nullptr;
  }
  s->ring_size_ = ring_size;
  s->memfd_ = std::move(memfd);
  size_t bytes = segment_bytes(ring_size);
  struct stat st{};
  int seals = sys::real().fcntl(s->memfd_.get(), F_GET_SEALS);
  bool ok = fstat(s->memfd_.get(), &st) == 0 && S_ISREG(st.st_mode) &&
            static_cast<size_t>(st.st_size) == bytes && seals >= 0 &&
            (static_cast<unsigned>(seals) & kRequiredSeals) == kRequiredSeals;
  void* base = ok ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd_.get(), 0) : MAP_FAILED;
  if (base == MAP_FAILED) {
    *err = ok ? -errno : -EPROTO;
    return nullptr;
  }
  s->header_ = static_cast<SegmentHeader*>(base);
  if (s->header_->magic != kSegmentMagic || s->header_->version != kSegmentVersion ||
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
