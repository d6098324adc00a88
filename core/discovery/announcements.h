// Remote clients' announcements: "a Hello with this nonce follows, from this
// address to this port" (see remote.h). A client's RDMA-CM probe, finished
// before its SYN, carries it; the listener's answering thread records it
// here; a server whose program is about to write first on a connection from
// another host waits for the Hello only while an announcement from that
// address to that port is pending; the Hello, when it arrives, consumes its
// announcement (by nonce).
//
// Bounded: kSlots announcements, kPerAddress from one address, each expiring
// after the setup timeout. A host that floods probes can fill the table (new
// announcements are then not recorded: their servers keep today's behaviour
// and may speak before the Hello) and can make a server wait, up to the setup
// timeout, only for connections from the addresses it announced from.
//
// The table lives in a MAP_SHARED anonymous mapping made by the process that
// answers probes, so the children it forks after accept() (rsync, sshd,
// prefork servers) see and consume the same announcements. A lock word (the
// holder's pid) guards it against the answering thread, the data path of
// every thread and of every forked child; it is held only for a scan of
// kSlots. A holder that died is taken over; a live one is waited for up to
// 50 ms, after which nothing is recorded, or the connection is not waited for.
#pragma once

#include <sys/socket.h>

#include <atomic>
#include <cstddef>
#include <cstdint>

namespace rdmashim::discovery {

// The private data of a probe that announces a Hello (`kAnnounce` then the
// Hello's 16-byte nonce); a bare probe carries "rdmashim/1?".
constexpr char kAnnounce[] = "rdmashim/1+";  // 12 bytes with its NUL
constexpr size_t kAnnounceBytes = sizeof kAnnounce + 16;

// An address as the table keys it: IPv4 as v4-mapped IPv6, plus the port.
struct AnnounceKey {
  uint8_t addr[16];
  uint16_t port;  // host order
};
// false unless `sa` is AF_INET or AF_INET6.
bool announce_key(const sockaddr* sa, socklen_t len, AnnounceKey* out);

class AnnouncementTable {
 public:
  static constexpr size_t kSlots = 128;
  static constexpr size_t kPerAddress = 16;

  // The answering thread: `client` (its address; port: the listening port it
  // probed) will send a Hello with `nonce`. false if not recorded (a bound,
  // the lock, or the same nonce again).
  bool record(const AnnounceKey& client, const uint8_t nonce[16], uint64_t now_ns, uint64_t ttl_ns);
  // Whether a Hello is still due from `client` (address, local port).
  bool pending(const AnnounceKey& client, uint64_t now_ns);
  // The Hello with `nonce` arrived: its announcement is done.
  bool consume(const uint8_t nonce[16]);
  // Live announcements (tests).
  size_t size(uint64_t now_ns);

 private:
  struct Slot {
    AnnounceKey key;
    uint8_t nonce[16];
    uint64_t expires_ns;  // 0: free
  };
  bool lock();
  void unlock() { lock_.store(0, std::memory_order_release); }
  std::atomic<uint32_t> lock_{0};
  Slot slots_[kSlots]{};
};

// The process's table (created by the first listener that answers probes,
// inherited by forked children), or nullptr.
AnnouncementTable* announcements();
AnnouncementTable* create_announcements();

// Server, about to write first on the accepted socket `fd` whose peer is on
// another host: whether that peer announced a Hello to this port.
bool remote_client_announced(int fd);
// Server: a Hello with `nonce` arrived (cheap when nothing answers probes here).
void remote_hello_arrived(const uint8_t nonce[16]);

}  // namespace rdmashim::discovery
