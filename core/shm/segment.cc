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
#include "util/fault.h"
#include "util/fd_budget.h"
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
  s->memfd_.reset(RDMASHIM_FAULT(kMemfd) ? -1 : memfd_create("rdmashim-ring", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  void* base = MAP_FAILED;
  const char* step = nullptr;  // which call failed, for the debug line
  // Sealed so the peer can never shrink it under us (which would SIGBUS us).
  if (!s->memfd_) step = "memfd_create";
  else if (!s->keep_memfd()) step = "moving the memfd out of the program's way";
  else if (RDMASHIM_FAULT(kFtruncate) || ftruncate(s->memfd_.get(), static_cast<off_t>(bytes)) != 0) step = "ftruncate";
  else if (RDMASHIM_FAULT(kSeals) || sys::real().fcntl(s->memfd_.get(), F_ADD_SEALS, kRequiredSeals) != 0) step = "F_ADD_SEALS";
  else if (RDMASHIM_FAULT(kMmap) || (base = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd_.get(), 0)) == MAP_FAILED)
    step = "mmap";
  if (step) {
    *err = -(errno ? errno : EIO);
    if (!s->memfd_) *err = fds::exhausted(*err) ? -EMFILE : *err;
    RDMASHIM_DEBUG("shm segment of %zu bytes: %s failed: %s", bytes, step, strerror(-*err));
    return nullptr;
  }
  s->header_ = new (base) SegmentHeader();
  s->header_->magic = kSegmentMagic;
  s->header_->version = kSegmentVersion;
  s->header_->ring_size = static_cast<uint32_t>(ring_size);
  return s;
}

std::unique_ptr<Segment> Segment::attach(UniqueFd memfd, size_t ring_size, int* err, bool received) {
  std::unique_ptr<Segment> s(new (std::nothrow) Segment());
  if (!s) {
    *err = -ENOMEM;
    return nullptr;
  }
  s->ring_size_ = ring_size;
  s->memfd_ = std::move(memfd);
  size_t bytes = segment_bytes(ring_size);
  // Received at the lowest free numbers: moved before anything else.
  if (received && s->memfd_ && !s->keep_memfd()) {
    *err = -EMFILE;
    return nullptr;
  }
  struct stat st{};
  int seals = sys::real().fcntl(s->memfd_.get(), F_GET_SEALS);
  bool ok = !RDMASHIM_FAULT(kAttachStat) && fstat(s->memfd_.get(), &st) == 0 && S_ISREG(st.st_mode) &&
            static_cast<size_t>(st.st_size) == bytes && seals >= 0 && !RDMASHIM_FAULT(kAttachSeals) &&
            (static_cast<unsigned>(seals) & kRequiredSeals) == kRequiredSeals;
  void* base = ok && !RDMASHIM_FAULT(kAttachMmap)
                   ? mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, s->memfd_.get(), 0)
                   : MAP_FAILED;
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

bool Segment::keep_memfd() {
  bool ok = fds::keep(memfd_);
  if (!ok) errno = EMFILE;
  return ok;
}

// The mapping keeps the memory (in both processes) without the descriptor,
// but a socket made inheritable later (fcntl, or dup2 onto 0..2 before exec)
// needs it back at exec: close it only when this process can reopen it from
// its mapping, which takes CAP_CHECKPOINT_RESTORE (or CAP_SYS_ADMIN); an
// unprivileged process keeps it, out of the program's numbers.
void Segment::close_memfd() {
  UniqueFd probe(open_from_mapping());
  if (probe) memfd_.reset();
}

// The memfd again, from our own mapping, for a connection about to follow
// exec after close_memfd(). -1 when this process lost the capability since
// (it dropped privileges): the connection cannot follow exec then.
int Segment::reopen_memfd() {
  if (!memfd_) {
    memfd_.reset(open_from_mapping());
    if (memfd_) keep_memfd();  // not at a number the new image's program expects free
  }
  return memfd_.get();
}

int Segment::open_from_mapping() const { return open_own_mapping(header_, segment_bytes(ring_size_)); }

int open_own_mapping(const void* start, size_t bytes) {
  char path[96];
  auto a = reinterpret_cast<uintptr_t>(start);
  snprintf(path, sizeof path, "/proc/self/map_files/%lx-%lx", static_cast<unsigned long>(a),
           static_cast<unsigned long>(a + bytes));
  return open(path, O_RDWR | O_CLOEXEC);
}

Segment::~Segment() {
  if (header_) munmap(header_, segment_bytes(ring_size_));
}

}  // namespace rdmashim::shm
