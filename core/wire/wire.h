// What rdmashim puts on the TCP connection it upgrades. All integers are
// little-endian; every struct is fixed-size and checked below.
//
// Client -> server:  [app bytes ...]                         (no rdmashim peer known: nothing added, ever)
//                    Hello [Params], Frame*, then Switch | Plain   (server advertised)
// Server -> client:  [app bytes ...]                         (app spoke before any Hello arrived)
//                    Ack [Params], Frame*, then Switch | Plain
// [Params] is a Params frame that follows a Hello offering verbs and an Ack
// choosing verbs at once: the two are read as one message.
//
// After Switch the direction's data moves through the ring and the TCP
// direction carries only control frames (Close, Ping) and, finally, FIN.
// After Plain the direction is raw TCP bytes again until the end.
// A direction on the ring may leave it again (both ends offered
// kHelloFlagDowngrade / kAckFlagDowngrade): its sender stops writing the
// ring and sends Downgrade{position}; the ring stream ends at that position
// and the direction continues as raw TCP bytes right after the frame.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <cstring>

namespace rdmashim::wire {

static_assert(std::endian::native == std::endian::little, "the wire layout is little-endian");

constexpr uint16_t kVersion = 1;

// The first byte 0xFF never starts UTF-8 text, a PostgreSQL startup packet
// (length, 0x00 first), TLS (0x16), RESP, HTTP or SSH, so a server sees at
// the first byte that a plain client is plain.
constexpr unsigned char kHelloMagic[8] = {0xFF, 'r', 'd', 'm', 'a', 's', 'h', 'H'};
constexpr unsigned char kAckMagic[8] = {0xFF, 'r', 'd', 'm', 'a', 's', 'h', 'A'};

enum TransportBits : uint32_t {
  kTransportShm = 1u << 0,
  kTransportVerbs = 1u << 1,
};

// Client's opening message.
//  0  magic[8]       kHelloMagic
//  8  version        u16
// 10  flags          u16 kHelloFlag* bits; 0 in version 1. The low byte holds
//                    bits a server must understand to upgrade (an unknown one:
//                    negative Ack, as for an unknown version); the high byte
//                    optional hints a server may ignore.
// 12  transports     u32 TransportBits the client can use
// 16  nonce[16]      random; echoed in Ack so app bytes can never pass for an Ack
// 32  rendezvous[16] random name of the client's rendezvous abstract unix socket
//                    that receives the shared-memory descriptors
// 48  sndbuf         u32 the client socket's SO_SNDBUF as the kernel reports
//                    it (0 from an older client): TCP buffers that much of
//                    the client's stream on its side, beyond what the server
//                    would, so a shared-memory ring holds it too
// 52  reserved[12]   zero
struct Hello {
  unsigned char magic[8];
  uint16_t version;
  uint16_t flags;
  uint32_t transports;
  unsigned char nonce[16];
  unsigned char rendezvous[16];
  uint32_t sndbuf;
  unsigned char reserved[12];
};
static_assert(sizeof(Hello) == 64);
constexpr uint16_t kHelloFlagsMustUnderstand = 0x00FF;
constexpr uint16_t kHelloFlagsKnown = 0;  // no must-understand bit defined yet
// Optional: the client reads Downgrade frames (a server that does not know
// the bit ignores it, and its Ack's flags byte is 0: it is never sent one).
constexpr uint16_t kHelloFlagDowngrade = 0x0100;

// Whether a server of this version may upgrade for this Hello; if not it
// answers with a negative Ack (version 1 layout) and both stay on TCP.
inline bool hello_understood(const Hello& h) {
  return h.version == kVersion && (h.flags & kHelloFlagsMustUnderstand & ~kHelloFlagsKnown) == 0;
}
static_assert(offsetof(Hello, transports) == 12 && offsetof(Hello, rendezvous) == 32 && offsetof(Hello, sndbuf) == 48);

// Server's answer to a Hello it saw before its application spoke.
//  0  magic[8]       kAckMagic
//  8  version        u16
// 10  transport      u16 TransportBits value chosen (0: none, stay on TCP)
// 12  ring_size      u32 bytes per direction
// 16  nonce[16]      the Hello's nonce
// 32  token[16]      secret that must accompany the descriptors on the unix socket
// 48  fallback       u8 when transport is 0: why (AckFallback); 0 if not said
// 49  flags          u8 kAckFlag* bits (0 from an older server: reserved then)
// 50  reserved[14]   zero
struct Ack {
  unsigned char magic[8];
  uint16_t version;
  uint16_t transport;
  uint32_t ring_size;
  unsigned char nonce[16];
  unsigned char token[16];
  uint8_t fallback;
  uint8_t flags;
  unsigned char reserved[14];
};
// Both ends read Downgrade frames: set only for a Hello with kHelloFlagDowngrade.
constexpr uint8_t kAckFlagDowngrade = 1;
enum AckFallback : uint8_t {
  kFallbackUnsaid = 0,       // an older server: read as policy
  kFallbackPolicy = 1,       // the server's configuration said no
  kFallbackSetupFailed = 2,  // the server could not build (or hand over) the transport
  kFallbackFdBudget = 3,     // its descriptors would have crowded the server program's own
  kFallbackSoftware = 4,     // its RDMA device is software, slower than TCP across hosts (verbs/policy.h)
  kFallbackVerbsLimit = 5,   // a verbs link would pass its device's limits or memory budget (verbs/limits.h)
};
static_assert(sizeof(Ack) == 64);
static_assert(offsetof(Ack, ring_size) == 12 && offsetof(Ack, token) == 32 && offsetof(Ack, flags) == 49);

enum class FrameType : uint16_t {
  kData = 1,    // payload: application bytes
  kSwitch = 2,  // no payload: further data in this direction is in the ring
  kPlain = 3,   // no payload: further bytes in this direction are raw TCP
  kClose = 4,   // payload: u64 final ring position; sender shut down writing, with ring writes not yet confirmed (else the FIN says it)
  kPing = 5,    // no payload: liveness probe while the ring is full
  kParams = 6,  // payload: verbs::Params (48 bytes), only right after a Hello or an Ack
  kDowngrade = 7,  // payload: Downgrade; only to a peer that offered it (kAckFlagDowngrade)
  kUrgent = 16, // payload: Urgent; MSG_OOB on a ring (the byte is not in the ring)
};

constexpr uint32_t kParamsBytes = 48;  // sizeof(verbs::Params), checked there

// The urgent byte of a send(MSG_OOB) on a ring, and where in the stream its mark is.
struct Urgent {
  uint64_t position;  // ring bytes before the mark
  uint8_t byte;
  uint8_t reserved[7];
};
static_assert(sizeof(Urgent) == 16);

// A direction leaves its ring (kDowngradeLeave), and/or the sender asks the
// peer to take its own direction off the ring too (kDowngradeAsk).
//  0  position  u64 with kDowngradeLeave: the sender's ring stream ends after
//               this many bytes (its tx position); the receiver reads the
//               ring up to there, then the raw TCP bytes after this frame.
//               0 without it.
//  8  flags     u8 kDowngrade* bits
//  9  reason    u8 DowngradeReason (for the peer's logs)
// 10  reserved  u8[6] zero
// Sent on a ring direction (Leave, with Ask if our rx is on a ring) or at a
// frame boundary of a framed one (Ask alone: the framed direction goes Plain).
struct Downgrade {
  uint64_t position;
  uint8_t flags;
  uint8_t reason;
  uint8_t reserved[6];
};
static_assert(sizeof(Downgrade) == 16);
constexpr uint8_t kDowngradeLeave = 1;
constexpr uint8_t kDowngradeAsk = 2;
// With Ask: the sender waits for the answer (it is about to fork or exec), so
// the peer answers at once, without waiting for data of its own to send.
constexpr uint8_t kDowngradeNow = 4;
// Why a connection leaves its rings (logged as tcp:downgraded:<name>).
enum DowngradeReason : uint8_t {
  kDowngradeUnsaid = 0,
  kDowngradeRequested = 1,  // Connection::downgrade() without a better reason
  kDowngradeTest = 2,       // RDMASHIM_TEST_SCHEDULE=<seed>,downgrade=<n>
  kDowngradeFork = 3,       // a fork the ring cannot follow (verbs)
  kDowngradeLimit = 4,      // a resource limit reached
  kDowngradeDevice = 5,     // the device under the ring is gone
  kDowngradeExec = 6,       // an exec the ring cannot follow (verbs)
  kDowngradeResent = 7,     // ring writes not confirmed, resent on TCP (verbs: a stopped reader, then exit)
  kDowngradeReasons
};
inline const char* downgrade_reason_name(uint8_t r) {
  static const char* const kNames[kDowngradeReasons] = {"unsaid", "requested", "test", "fork",
                                                        "limit",  "device",    "exec", "resent"};
  return r < kDowngradeReasons ? kNames[r] : "unsaid";
}

// Header of every frame after Hello/Ack.
//  0  length   u32 payload bytes that follow
//  4  type     u16 FrameType
//  6  reserved u16 zero
struct FrameHeader {
  uint32_t length;
  uint16_t type;
  uint16_t reserved;
};
static_assert(sizeof(FrameHeader) == 8);

constexpr uint32_t kMaxDataFrame = 1u << 20;    // a larger write is cut into frames
constexpr uint32_t kMaxControlPayload = 64;     // a larger control frame is a protocol error

// A frame header received from the peer, checked before anything trusts it.
inline bool valid(const FrameHeader& h) {
  switch (static_cast<FrameType>(h.type)) {
    case FrameType::kData: return h.length > 0 && h.length <= kMaxDataFrame;
    case FrameType::kSwitch:
    case FrameType::kPlain:
    case FrameType::kPing: return h.length == 0;
    case FrameType::kClose: return h.length == sizeof(uint64_t);
    case FrameType::kParams: return h.length == kParamsBytes;
    case FrameType::kUrgent: return h.length == sizeof(Urgent);
    case FrameType::kDowngrade: return h.length == sizeof(Downgrade);
  }
  return false;
}

// A Hello or Ack together with the Params frame that follows it when the
// transport is verbs: what the receiver peeks and consumes as one message.
struct ParamsFrame {
  FrameHeader header;  // {kParamsBytes, kParams, 0}
  unsigned char params[kParamsBytes];
};
static_assert(sizeof(ParamsFrame) == 56);
constexpr size_t kMaxHandshakeMessage = 64 + sizeof(ParamsFrame);

inline bool valid_params_frame(const ParamsFrame& f) {
  return f.header.type == static_cast<uint16_t>(FrameType::kParams) && f.header.length == kParamsBytes &&
         f.header.reserved == 0;
}

// How much of `prefix` (len bytes received so far) agrees with `magic`.
enum class Match { kNo, kPartial, kYes };
inline Match match_magic(const unsigned char (&magic)[8], const void* prefix, size_t len) {
  size_t n = len < sizeof magic ? len : sizeof magic;
  if (memcmp(magic, prefix, n) != 0) return Match::kNo;
  return n == sizeof magic ? Match::kYes : Match::kPartial;
}

}  // namespace rdmashim::wire
