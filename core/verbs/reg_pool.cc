#include "verbs/reg_pool.h"

namespace rdmashim::verbs {

bool RegPool::take(size_t size, bool remote, Buffer* out) {
  for (size_t i = pool_.size(); i-- > 0;) {  // the newest first: the most likely still cached
    if (pool_[i].size == size && pool_[i].remote == remote) {
      *out = pool_[i];
      bytes_ -= size;
      pool_.erase(pool_.begin() + static_cast<long>(i));
      return true;
    }
  }
  return false;
}

bool RegPool::evict_oldest(Buffer* out) {
  if (pool_.empty()) return false;
  *out = pool_.front();
  bytes_ -= out->size;
  pool_.erase(pool_.begin());
  return true;
}

void RegPool::give_back(const Buffer& b, std::vector<Buffer>* drop) {
  if (!b.mr) return;
  if (b.size > cap_) {
    drop->push_back(b);
    return;
  }
  size_t evict = 0;
  while (evict < pool_.size() && (bytes_ + b.size > cap_ || pool_.size() - evict >= kMaxEntries)) {
    bytes_ -= pool_[evict].size;
    drop->push_back(pool_[evict++]);
  }
  pool_.erase(pool_.begin(), pool_.begin() + static_cast<long>(evict));
  pool_.push_back(b);
  bytes_ += b.size;
}

}  // namespace rdmashim::verbs
