// The bytes rdma_send and rdma_recv exchange inside their rdmashim Stream.
// The stream only ever connects our two tools, so this format is ours; it
// exists so that a transfer can never end "successfully" short, reordered
// or corrupted without one of the two tools saying so.
//
// All integers are little-endian; every struct is fixed-size, naturally
// aligned, and checked below. Version 1:
//
//   rdma_send -> rdma_recv   Header                         right after connect
//   rdma_recv -> rdma_send   Greeting                       once a valid Header arrived
//   rdma_send -> rdma_recv   { Record(kData) payload[length] }*
//                            Trailer                        after EOF on the input
//   rdma_recv -> rdma_send   Reply                          after the last byte reached stdout
//                                                           (or earlier, on a failure)
//
// - The sender speaks first: a TCP server that waits for its client's first
//   bytes sees them at once (rdmashim's accept() waits up to its setup
//   timeout for a client that stays silent and expects the server to
//   speak). The sender sends no payload before the Greeting, so it knows it
//   talks to rdma_recv (and not to some other server), and learns whether
//   the receiver wants a checksum (rdma_recv --verify).
// - Both sides compute the checksum iff either asked for it: the sender's
//   Header says kHasChecksum when rdma_send --verify, the Greeting says
//   kWantChecksum when rdma_recv --verify; the Trailer's kHasChecksum says
//   the checksum field is valid.
// - Every data record carries the stream offset of its first byte, so a
//   lost or duplicated piece shows as a wrong offset, not as a wrong file.
// - The Trailer carries the byte count and, with a checksum, the XXH64 of
//   the payload. A stream that ends (EOF, reset) without a valid Trailer is
//   a failed transfer: the receiver exits 1.
// - The Reply tells the sender whether the receiver got (and wrote out)
//   everything, so rdma_send's exit code means "it arrived", not merely
//   "it left".
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rdmashim::cat {

static_assert(std::endian::native == std::endian::little, "the stream format is little-endian");

constexpr uint16_t kVersion = 1;
constexpr uint16_t kDefaultPort = 18515;

// A data record carries at most this many payload bytes; a larger length in
// a Record from the peer is a protocol error.
constexpr uint32_t kMaxRecord = 16u << 20;
// Header.size when the sender does not know the size (a pipe).
constexpr uint64_t kUnknownSize = ~uint64_t{0};

constexpr unsigned char kGreetingMagic[8] = {'r', 'd', 'm', 'a', 'c', 'a', 't', 'G'};
constexpr unsigned char kHeaderMagic[8] = {'r', 'd', 'm', 'a', 'c', 'a', 't', 'H'};
constexpr unsigned char kReplyMagic[8] = {'r', 'd', 'm', 'a', 'c', 'a', 't', 'R'};

// Greeting flags (what the receiver wants).
constexpr uint16_t kWantChecksum = 1u << 0;
// Header and Trailer flags.
constexpr uint16_t kHasChecksum = 1u << 0;  // Header: the sender's --verify; Trailer: the checksum field is valid
constexpr uint16_t kSizeKnown = 1u << 1;    // Header: .size is the input's size (advisory: progress, ETA)

// Receiver's answer to a valid Header.
//  0  magic[8]   kGreetingMagic
//  8  version    u16 kVersion
// 10  flags      u16 kWantChecksum
// 12  reserved   u32 zero
// 16  reserved   u64[2] zero
struct Greeting {
  unsigned char magic[8];
  uint16_t version;
  uint16_t flags;
  uint32_t reserved0;
  uint64_t reserved1[2];
};
static_assert(sizeof(Greeting) == 32);
static_assert(offsetof(Greeting, version) == 8 && offsetof(Greeting, flags) == 10);

// Sender's opening message.
//  0  magic[8]   kHeaderMagic
//  8  version    u16 kVersion
// 10  flags      u16 kHasChecksum | kSizeKnown
// 12  reserved   u32 zero
// 16  size       u64 input size when kSizeKnown (the Trailer's count is what counts), else kUnknownSize
// 24  reserved   u64 zero
struct Header {
  unsigned char magic[8];
  uint16_t version;
  uint16_t flags;
  uint32_t reserved0;
  uint64_t size;
  uint64_t reserved1;
};
static_assert(sizeof(Header) == 32);
static_assert(offsetof(Header, flags) == 10 && offsetof(Header, size) == 16);

// What follows a Header: data records, then exactly one end record (the
// first 16 bytes of the Trailer).
enum RecordType : uint32_t {
  kRecordData = 0x41544144,  // "DATA"
  kRecordEnd = 0x21444e45,   // "END!"
};

// Record header.
//  0  type     u32 RecordType
//  4  length   u32 kData: payload bytes that follow (1..kMaxRecord); kEnd: 16 (rest of the Trailer)
//  8  position u64 kData: stream offset of the payload's first byte; kEnd: total payload bytes
struct Record {
  uint32_t type;
  uint32_t length;
  uint64_t position;
};
static_assert(sizeof(Record) == 16);
static_assert(offsetof(Record, length) == 4 && offsetof(Record, position) == 8);

// End of the payload.
//  0  end       Record {kRecordEnd, 16, total payload bytes}
// 16  checksum  u64 XXH64 (seed 0) of the whole payload when flags has kHasChecksum, else 0
// 24  flags     u32 kHasChecksum
// 28  reserved  u32 zero
struct Trailer {
  Record end;
  uint64_t checksum;
  uint32_t flags;
  uint32_t reserved;
};
static_assert(sizeof(Trailer) == 32);
static_assert(offsetof(Trailer, checksum) == 16 && offsetof(Trailer, flags) == 24);
constexpr uint32_t kTrailerRest = sizeof(Trailer) - sizeof(Record);

// Receiver's verdict.
enum ReplyStatus : uint32_t {
  kOk = 0,                // every byte arrived and was written to stdout
  kCountMismatch = 1,     // the Trailer's count differs from what arrived
  kChecksumMismatch = 2,  // the checksums differ
  kOutputFailed = 3,      // writing stdout failed (downstream closed, disk full, ...)
  kProtocolError = 4,     // malformed record, wrong offset, bad trailer
};

//  0  magic[8]   kReplyMagic
//  8  status     u32 ReplyStatus
// 12  error      u32 errno of a failed output (kOutputFailed), else 0
// 16  bytes      u64 payload bytes the receiver wrote to its stdout
// 24  checksum   u64 the receiver's XXH64 of those bytes (0 without a checksum)
struct Reply {
  unsigned char magic[8];
  uint32_t status;
  uint32_t error;
  uint64_t bytes;
  uint64_t checksum;
};
static_assert(sizeof(Reply) == 32);
static_assert(offsetof(Reply, status) == 8 && offsetof(Reply, bytes) == 16);

inline Greeting make_greeting(uint16_t flags) {
  Greeting g{};
  memcpy(g.magic, kGreetingMagic, sizeof g.magic);
  g.version = kVersion;
  g.flags = flags;
  return g;
}

inline Header make_header(uint16_t flags, uint64_t size) {
  Header h{};
  memcpy(h.magic, kHeaderMagic, sizeof h.magic);
  h.version = kVersion;
  h.flags = flags;
  h.size = (flags & kSizeKnown) ? size : kUnknownSize;
  return h;
}

inline Trailer make_trailer(uint64_t bytes, bool has_checksum, uint64_t checksum) {
  Trailer t{};
  t.end = Record{kRecordEnd, kTrailerRest, bytes};
  t.checksum = has_checksum ? checksum : 0;
  t.flags = has_checksum ? kHasChecksum : 0;
  return t;
}

inline Reply make_reply(ReplyStatus status, uint32_t error, uint64_t bytes, uint64_t checksum) {
  Reply r{};
  memcpy(r.magic, kReplyMagic, sizeof r.magic);
  r.status = status;
  r.error = error;
  r.bytes = bytes;
  r.checksum = checksum;
  return r;
}

// Checks of what the peer sent; nothing is trusted before these pass.
inline bool valid(const Greeting& g) {
  return memcmp(g.magic, kGreetingMagic, sizeof g.magic) == 0 && g.version == kVersion;
}
inline bool valid(const Header& h) {
  return memcmp(h.magic, kHeaderMagic, sizeof h.magic) == 0 && h.version == kVersion &&
         (h.flags & ~(kHasChecksum | kSizeKnown)) == 0 && ((h.flags & kSizeKnown) != 0) == (h.size != kUnknownSize);
}
inline bool valid(const Reply& r) {
  return memcmp(r.magic, kReplyMagic, sizeof r.magic) == 0 && r.status <= kProtocolError;
}
// A record header that may follow `position` payload bytes.
inline bool valid_data(const Record& r, uint64_t position) {
  return r.type == kRecordData && r.length > 0 && r.length <= kMaxRecord && r.position == position;
}
inline bool valid_end(const Record& r) { return r.type == kRecordEnd && r.length == kTrailerRest; }
inline bool valid_rest(const Trailer& t) { return (t.flags & ~uint32_t{kHasChecksum}) == 0; }

const char* status_text(ReplyStatus s);

}  // namespace rdmashim::cat
