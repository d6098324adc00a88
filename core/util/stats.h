// Per-process counters of how connections ended up, and one row per live
// connection. They live in a memfd ("rdmashim-stats"), created at the first
// connection, so that `rdmashim stat` can read every process's page through
// /proc/PID/fd without any file, socket or thread: the page dies with the
// process. Only the owning process writes it; the data path adds to its
// row's counters with relaxed atomics (no system call, no lock).
#pragma once

#include <netinet/in.h>

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rdmashim::stats {

// Why a connection uses the transport it uses. Every TCP fallback has a reason.
enum class Outcome : int {
  kShm,                 // upgraded to the shared-memory rings
  kVerbs,               // upgraded to RDMA verbs rings
  kTcpNotAdvertised,    // client: no rdmashim listener for that address on this host
  kTcpPeerPlain,        // server: the client sent application bytes, not a Hello
  kTcpServerSpokeFirst, // the server's application wrote before a Hello arrived
  kTcpSetupFailed,      // both ends run rdmashim but building the transport failed
  kTcpTimeout,          // the handshake did not finish within RDMASHIM_SETUP_TIMEOUT_MS
  kTcpPolicy,           // RDMASHIM_TRANSPORT=tcp, RDMASHIM_FORKGEN or RDMASHIM_DISABLE said no
  kTcpFdBudget,         // the descriptors the transport needs would crowd the program's own (util/fd_budget.h)
  kTcpVerbsLimit,       // a verbs link would pass the device's limits or the registered-memory budget (verbs/limits.h)
  kCount
};
constexpr int kOutcomes = static_cast<int>(Outcome::kCount);
constexpr int kV2Outcomes = 8;  // counted in Page::counts; later ones in Page::counts_added

// One live connection (256 bytes). `seq` is the row's generation, a seqlock:
// seq % 4 is 0 for a free row, 1 while the owner fills it, 2 while it is
// live (and +2 frees it). A reader copies a row with seq % 4 == 2 and keeps
// the copy only if seq did not change meanwhile. Counters are monotonic.
//   0  seq        u32
//   4  outcome    i32 Outcome
//   8  fd         i32   12 role  u32 (0 client, 1 server)
//  16  inode      u64 the socket's inode (0 on TCP rows: see below)
//  24  ring_bytes u64 each ring's size, 0 on TCP
//  32  local      sockaddr_in6 (28 bytes; an AF_INET address fits), pad to 64
//  64  peer       sockaddr_in6, pad to 96
//      (inode and addresses are filled on shm/verbs rows only; on TCP rows
//      they are zero and the reader takes them from the kernel: the fd's
//      /proc link and sock_diag, so a plain connection's row costs no call)
//  96  tx_bytes tx_msgs rx_bytes rx_msgs  u64 each: what Connection::send/recv returned
// 128  rx_unread, tx_unacked  u64 each: reserved (0). The rings' fill is what
//      one end's tx_bytes exceeds the other end's rx_bytes, computed by the
//      reader when it sees both ends (the data path pays nothing for it).
// 144  opened_ns  u64 CLOCK_REALTIME at settle
// 152  downgraded char[16] NUL-terminated reason once the connection left its
//      rings for TCP (shown as tcp:downgraded:<reason>); "" before (and in
//      rows of older writers, whose padding is zero)
struct Slot {
  std::atomic<uint32_t> seq;
  int32_t outcome;
  int32_t fd;
  uint32_t role;
  uint64_t inode;
  uint64_t ring_bytes;
  sockaddr_in6 local;
  unsigned char pad0[4];
  sockaddr_in6 peer;
  unsigned char pad1[4];
  std::atomic<uint64_t> tx_bytes, tx_msgs, rx_bytes, rx_msgs;
  std::atomic<uint64_t> rx_unread, tx_unacked;
  uint64_t opened_ns;
  char downgraded[16];
  unsigned char pad2[88];
};
static_assert(sizeof(Slot) == 256 && offsetof(Slot, downgraded) == 152);

// The page's layout, read by `rdmashim stat` (checked there by magic+version).
// Version 1 was the header alone in 4 KiB (the first 80 bytes are the same).
//  0  magic     u64 kPageMagic
//  8  version   u32 kPageVersion
// 12  pid       i32
// 16  counts    u64[8] connections per Outcome, in enum order (the first 8)
// 80  slots     u32 rows in the table (kSlots)
// 84  pad       u32
// 88  unlisted  u64 live connections without a row (the table was full)
// 96  counts_added u64[8] outcomes added since (kTcpFdBudget first); an
//              older writer left them 0, an older reader skips them
// 160 verbs_registered u64 bytes registered with the RDMA device (pinned)
// 168 verbs_pooled     u64 of which kept for reuse by the next connection
// 176 verbs_qps        u64 live queue pairs (one per verbs link)
// 184 verbs_cqs        u64 live completion queues
// 192 verbs_mrs        u64 live memory registrations (pooled ones included)
// 200 verbs_beats      u64 idle heartbeats posted (RDMASHIM_HEARTBEAT_S)
//              (an older writer left 176..255 zero)
// 256 slot      Slot[kSlots]
struct Page {
  uint64_t magic;
  uint32_t version;
  int32_t pid;
  std::atomic<uint64_t> counts[kV2Outcomes];
  uint32_t slots;
  uint32_t pad;
  std::atomic<uint64_t> unlisted;
  std::atomic<uint64_t> counts_added[8];
  std::atomic<uint64_t> verbs_registered, verbs_pooled;
  std::atomic<uint64_t> verbs_qps, verbs_cqs, verbs_mrs;
  std::atomic<uint64_t> verbs_beats;
  unsigned char pad2[256 - 208];
  std::atomic<uint64_t>& count_of(int outcome) {
    return outcome < kV2Outcomes ? counts[outcome] : counts_added[outcome - kV2Outcomes];
  }
  const std::atomic<uint64_t>& count_of(int outcome) const { return const_cast<Page*>(this)->count_of(outcome); }
  Slot slot[255];
};
constexpr uint64_t kPageMagic = 0x7374617473686d72ull;  // "rmhstats"
constexpr uint32_t kPageVersion = 2;
constexpr uint32_t kSlots = 255;
constexpr size_t kPageBytes = 65536;
constexpr size_t kPageV1Bytes = 4096;
constexpr const char kMemfdName[] = "rdmashim-stats";
static_assert(sizeof(Page) == kPageBytes);
static_assert(offsetof(Page, slots) == 16 + 8 * kV2Outcomes && offsetof(Page, counts_added) == 96 &&
              offsetof(Page, verbs_registered) == 160 && offsetof(Page, verbs_mrs) == 192 &&
              offsetof(Page, verbs_beats) == 200);
static_assert(kOutcomes <= kV2Outcomes + 8);

const char* name(Outcome o);
// The verbs resources this process holds. verbs::Device changes them where
// each is created and destroyed (and the pool takes or gives up a buffer);
// written into the page if there is one (never creates it).
struct VerbsResources {
  int64_t registered = 0, pooled = 0;  // bytes
  int64_t qps = 0, cqs = 0, mrs = 0;
  int64_t beats = 0;  // idle heartbeats posted (a count, never taken back)
};
void verbs_add(const VerbsResources& delta);
VerbsResources verbs_resources();
// In a forked child: the parent's resources are not ours (all zero again).
void verbs_reset();
void count(Outcome o);
void uncount(Outcome o);  // a connection counted as `o` turned out otherwise
uint64_t get(Outcome o);
// In a child after fork(): the inherited page is the parent's; start anew
// (rows of the connections the child inherited are kept, counters reset).
void after_fork_child();

// A connection's row: taken when it settles, given back when it goes. With
// a full table the connection is counted in `unlisted` and row() is null.
class Row {
 public:
  Row() = default;
  ~Row() { close(); }
  Row(const Row&) = delete;
  Row& operator=(const Row&) = delete;
  // fd: addresses and inode are read from it now (once, at setup).
  void open(int fd, Outcome o, bool server, uint64_t ring_bytes);
  // The connection left its rings: `reason` (truncated to 15 bytes) shown.
  void downgraded(const char* reason);
  void close();
  // A connection counted as upgraded whose peer could not attach: now on TCP.
  void set_outcome(Outcome o) {
    if (slot_) slot_->outcome = static_cast<int32_t>(o), slot_->ring_bytes = 0;
  }
  Slot* row() const { return slot_; }
  // The data path: relaxed adds to our own row (to the Row itself before
  // open(): what moved during the handshake is carried over). A load and a
  // store, no locked instruction: two threads sending on one connection at
  // once may lose a count, never corrupt one.
  void sent(ssize_t n) const {
    if (n > 0) bump(ctr_.load(std::memory_order_relaxed) + kTxBytes, static_cast<uint64_t>(n));
  }
  void received(ssize_t n) const {
    if (n > 0) bump(ctr_.load(std::memory_order_relaxed) + kRxBytes, static_cast<uint64_t>(n));
  }

 private:
  // Slot's tx_bytes .. tx_unacked, in order.
  enum { kTxBytes, kTxMsgs, kRxBytes, kRxMsgs, kRxUnread, kTxUnacked, kCounters };
  static void bump(std::atomic<uint64_t>* c, uint64_t n) {  // c[0] += n, c[1] += 1
    c[0].store(c[0].load(std::memory_order_relaxed) + n, std::memory_order_relaxed);
    c[1].store(c[1].load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
  }
  mutable std::atomic<uint64_t> own_[kCounters] = {};
  std::atomic<std::atomic<uint64_t>*> ctr_{own_};
  Slot* slot_ = nullptr;
  bool unlisted_ = false;
};
static_assert(offsetof(Slot, tx_unacked) - offsetof(Slot, tx_bytes) == 5 * 8);

}  // namespace rdmashim::stats
