#include "util/stats.h"

namespace rdmashim::stats {
namespace {
std::atomic<uint64_t> g_counts[static_cast<int>(Outcome::kCount)];
}

const char* name(Outcome o) {
  switch (o) {
    case Outcome::kShm: return "shm";
    case Outcome::kVerbs: return "verbs";
    case Outcome::kTcpNotAdvertised: return "tcp:not-advertised";
    case Outcome::kTcpPeerPlain: return "tcp:peer-plain";
    case Outcome::kTcpServerSpokeFirst: return "tcp:server-spoke-first";
    case Outcome::kTcpSetupFailed: return "tcp:setup-failed";
    case Outcome::kTcpTimeout: return "tcp:timeout";
    case Outcome::kTcpPolicy: return "tcp:policy";
    case Outcome::kCount: break;
  }
  return "?";
}

void count(Outcome o) { g_counts[static_cast<int>(o)].fetch_add(1, std::memory_order_relaxed); }
uint64_t get(Outcome o) { return g_counts[static_cast<int>(o)].load(std::memory_order_relaxed); }

}  // namespace rdmashim::stats
