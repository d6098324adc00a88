// core/util/stats: rows of the per-process page that `rdmashim stat` reads
// (filled at open, counted, freed, a full table, a forked child's own page).
#include "util/stats.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "util/unique_fd.h"

namespace rdmashim::stats {
namespace {

// This process's page, mapped read-only as `rdmashim stat` maps it.
struct Mapped {
  const Page* page = nullptr;
  std::string target;  // the memfd's identity, to tell pages apart
  ~Mapped() {
    if (page) munmap(const_cast<Page*>(page), kPageBytes);
  }
};
// Every open descriptor: the page's lives above the soft limit when it can.
std::vector<int> open_fds() {
  std::vector<int> fds;
  DIR* d = opendir("/proc/self/fd");
  while (dirent* e = d ? readdir(d) : nullptr) {
    if (e->d_name[0] != '.') fds.push_back(atoi(e->d_name));
  }
  if (d) closedir(d);
  return fds;
}

void map_own_page(Mapped* m) {
  for (int fd : open_fds()) {
    std::string link = "/proc/self/fd/" + std::to_string(fd);
    char target[256];
    ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
    if (n <= 0) continue;
    target[n] = '\0';
    if (strncmp(target, "/memfd:rdmashim-stats", 21) != 0) continue;
    struct stat st{};
    fstat(fd, &st);
    m->target = std::to_string(st.st_ino);
    void* p = mmap(nullptr, kPageBytes, PROT_READ, MAP_SHARED, fd, 0);
    if (p != MAP_FAILED) m->page = static_cast<const Page*>(p);
    return;
  }
}

// A connected loopback TCP pair: {client, server}.
std::pair<UniqueFd, UniqueFd> tcp_pair() {
  UniqueFd l(socket(AF_INET, SOCK_STREAM, 0));
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  EXPECT_EQ(bind(l.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  EXPECT_EQ(listen(l.get(), 1), 0);
  EXPECT_EQ(getsockname(l.get(), reinterpret_cast<sockaddr*>(&a), &len), 0);
  UniqueFd c(socket(AF_INET, SOCK_STREAM, 0));
  EXPECT_EQ(connect(c.get(), reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
  UniqueFd s(accept(l.get(), nullptr, nullptr));
  return {std::move(c), std::move(s)};
}

uint16_t port_of(const sockaddr_in6& a) { return ntohs(reinterpret_cast<const sockaddr_in*>(&a)->sin_port); }

TEST(StatsRow, FilledAtOpenCountedAndFreed) {
  auto [c, s] = tcp_pair();
  Row row;
  row.sent(100);  // before open: carried over
  row.received(7);
  row.open(c.get(), Outcome::kShm, false, 1 << 20);
  Slot* slot = row.row();
  ASSERT_NE(slot, nullptr);
  row.sent(50);
  row.sent(-11);  // errors count nothing
  row.received(0);
  EXPECT_EQ(slot->seq.load() % 4, 2u);
  EXPECT_EQ(slot->fd, c.get());
  EXPECT_EQ(slot->outcome, static_cast<int>(Outcome::kShm));
  EXPECT_EQ(slot->role, 0u);
  EXPECT_EQ(slot->ring_bytes, uint64_t{1} << 20);
  sockaddr_in peer{};
  socklen_t len = sizeof peer;
  getpeername(c.get(), reinterpret_cast<sockaddr*>(&peer), &len);
  EXPECT_EQ(port_of(slot->peer), ntohs(peer.sin_port));
  EXPECT_NE(port_of(slot->local), 0);
  EXPECT_EQ(slot->tx_bytes.load(), 150u);
  EXPECT_EQ(slot->tx_msgs.load(), 2u);
  EXPECT_EQ(slot->rx_bytes.load(), 7u);
  EXPECT_EQ(slot->rx_msgs.load(), 1u);
  Mapped m;
  map_own_page(&m);
  ASSERT_NE(m.page, nullptr);
  EXPECT_EQ(m.page->version, kPageVersion);
  EXPECT_EQ(m.page->slots, kSlots);
  uint32_t gen = slot->seq.load();
  row.close();
  EXPECT_EQ(row.row(), nullptr);
  EXPECT_EQ(slot->seq.load(), gen + 2);  // free, and a reader's copy from before is seen as stale
  row.sent(1);                           // after close: the slot is not written
  EXPECT_EQ(slot->tx_bytes.load(), 150u);
}

// A server counted its connection as upgraded; the client's Plain says it
// could not attach: the count and the row move to the TCP reason.
TEST(StatsRow, AnUpgradeThePeerNeverAttachedIsRecountedAsTcp) {
  auto [c, s] = tcp_pair();
  Row row;
  uint64_t shm = get(Outcome::kShm), failed = get(Outcome::kTcpSetupFailed);
  count(Outcome::kShm);
  row.open(s.get(), Outcome::kShm, true, 1 << 16);
  ASSERT_NE(row.row(), nullptr);
  uint32_t gen = row.row()->seq.load();
  uncount(Outcome::kShm);
  count(Outcome::kTcpSetupFailed);
  row.set_outcome(Outcome::kTcpSetupFailed);
  EXPECT_EQ(get(Outcome::kShm), shm);
  EXPECT_EQ(get(Outcome::kTcpSetupFailed), failed + 1);
  EXPECT_EQ(row.row()->outcome, static_cast<int>(Outcome::kTcpSetupFailed));
  EXPECT_EQ(row.row()->ring_bytes, 0u);
  EXPECT_EQ(row.row()->seq.load(), gen);  // still the same live row
  Mapped m;
  map_own_page(&m);
  ASSERT_NE(m.page, nullptr);
  EXPECT_EQ(m.page->counts[static_cast<int>(Outcome::kShm)].load(), shm);
  EXPECT_EQ(m.page->counts[static_cast<int>(Outcome::kTcpSetupFailed)].load(), failed + 1);
  row.close();
}

// A connection that left its rings says why in its row; the text goes in
// while the row is out of the live state, and a reused row starts empty.
TEST(StatsRow, DowngradedReasonAndReuse) {
  auto [c, s] = tcp_pair();
  Slot* slot = nullptr;
  {
    Row row;
    row.open(c.get(), Outcome::kShm, true, 4096);
    slot = row.row();
    ASSERT_NE(slot, nullptr);
    EXPECT_EQ(slot->downgraded[0], 0);
    uint32_t gen = slot->seq.load();
    row.downgraded("peer-device-and-more");
    EXPECT_EQ(slot->seq.load(), gen);  // live again, same generation
    EXPECT_STREQ(slot->downgraded, "peer-device-and");  // 15 bytes at most
    EXPECT_EQ(slot->outcome, static_cast<int>(Outcome::kShm));  // the handshake's outcome stays
  }
  Row again;
  again.open(c.get(), Outcome::kShm, true, 4096);
  ASSERT_NE(again.row(), nullptr);
  EXPECT_EQ(again.row()->downgraded[0], 0);
}

// What verbs::Device counts lands in the page `rdmashim stat` reads.
TEST(StatsPage, CarriesTheVerbsResources) {
  VerbsResources before = verbs_resources();
  verbs_add({.registered = int64_t{48} << 20, .pooled = int64_t{16} << 20, .qps = 2, .cqs = 2, .mrs = 7});
  auto [c, s] = tcp_pair();
  Row row;
  row.open(c.get(), Outcome::kVerbs, false, 16 << 20);  // makes sure the page exists
  verbs_add({.qps = 1, .cqs = 1, .mrs = 3, .beats = 2});
  Mapped m;
  map_own_page(&m);
  ASSERT_NE(m.page, nullptr);
  EXPECT_EQ(m.page->verbs_registered.load(), static_cast<uint64_t>(before.registered + (int64_t{48} << 20)));
  EXPECT_EQ(m.page->verbs_pooled.load(), static_cast<uint64_t>(before.pooled + (int64_t{16} << 20)));
  EXPECT_EQ(m.page->verbs_qps.load(), static_cast<uint64_t>(before.qps + 3));
  EXPECT_EQ(m.page->verbs_cqs.load(), static_cast<uint64_t>(before.cqs + 3));
  EXPECT_EQ(m.page->verbs_mrs.load(), static_cast<uint64_t>(before.mrs + 10));
  EXPECT_EQ(m.page->verbs_beats.load(), static_cast<uint64_t>(before.beats + 2));
  verbs_add({.registered = -(int64_t{48} << 20), .pooled = -(int64_t{16} << 20), .qps = -3, .cqs = -3, .mrs = -10});
  EXPECT_EQ(m.page->verbs_registered.load(), static_cast<uint64_t>(before.registered));
  EXPECT_EQ(m.page->verbs_qps.load(), static_cast<uint64_t>(before.qps));
  EXPECT_EQ(m.page->verbs_mrs.load(), static_cast<uint64_t>(before.mrs));
}

int live_rows(const Page* p) {
  int n = 0;
  for (const Slot& slot : p->slot) n += slot.seq.load() % 4 == 2;
  return n;
}

TEST(StatsRow, AFullTableCountsTheRestAsUnlisted) {
  auto [c, s] = tcp_pair();
  Row first;
  first.open(s.get(), Outcome::kShm, true, 0);  // the page exists from here
  Mapped m;
  map_own_page(&m);
  ASSERT_NE(m.page, nullptr);
  int before = live_rows(m.page) - 1;  // other tests' connections, if any
  uint64_t unlisted_before = m.page->unlisted.load();
  std::vector<std::unique_ptr<Row>> rows;
  while (rows.size() < kSlots + 3) {
    rows.push_back(std::make_unique<Row>());
    rows.back()->open(s.get(), Outcome::kTcpPeerPlain, true, 0);
  }
  EXPECT_EQ(live_rows(m.page), static_cast<int>(kSlots));
  EXPECT_EQ(m.page->unlisted.load() - unlisted_before, static_cast<uint64_t>(before) + 4);
  rows.pop_back();  // an unlisted one goes
  EXPECT_EQ(m.page->unlisted.load() - unlisted_before, static_cast<uint64_t>(before) + 3);
  rows.erase(rows.begin());  // a listed one goes: its row is free for the next
  auto next = std::make_unique<Row>();
  next->open(s.get(), Outcome::kShm, true, 0);
  EXPECT_NE(next->row(), nullptr);
  rows.clear();
  next.reset();
  first.close();
  EXPECT_EQ(m.page->unlisted.load(), unlisted_before);
  EXPECT_EQ(live_rows(m.page), before);
}

TEST(StatsRow, AForkedChildListsWhatItInheritedOnItsOwnPage) {
  auto [c, s] = tcp_pair();
  Row row;
  row.open(c.get(), Outcome::kShm, false, 4096);
  row.sent(10);
  Mapped parent;
  map_own_page(&parent);
  ASSERT_NE(parent.page, nullptr);
  pid_t pid = fork();
  if (pid == 0) {
    after_fork_child();
    Mapped child;
    map_own_page(&child);
    int bad = 0;
    if (!child.page || child.target == parent.target) bad |= 1;                 // a page of its own
    if (child.page && child.page->pid != getpid()) bad |= 2;
    if (row.row()->seq.load() % 4 != 2 || row.row()->tx_bytes.load() != 0) bad |= 4;  // listed, from zero
    row.sent(5);
    bool seen = false;  // the child's reader sees its own count on its row
    for (int i = 0; child.page && i < static_cast<int>(kSlots); ++i) {
      const Slot& slot = child.page->slot[i];
      seen |= slot.seq.load() % 4 == 2 && slot.fd == c.get() && slot.tx_bytes.load() == 5;
    }
    if (!seen) bad |= 8;
    _exit(bad);
  }
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0);
  EXPECT_EQ(row.row()->tx_bytes.load(), 10u);  // the child's count did not reach the parent's page
}

}  // namespace
}  // namespace rdmashim::stats
