// A link is what one ring connection needs from a transport: one-sided writes
// into the peer's receive ring, two published cursors, and a doorbell.
//
//   producer: put(offset, bytes)* then publish_tail(tail)   -> peer sees data
//   consumer: reads its own rx memory, then publish_head(h)  -> peer sees credit
//
// Three links implement it: shared memory (ShmLink), RDMA verbs (VerbsLink),
// and an in-process fake with fault injection for the unit tests (FakeLink).
// The ring protocol above it (RingChannel) is the same for all of them.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>

namespace rdmashim {

class Link {
 public:
  virtual ~Link() = default;

  // Bytes in each direction's ring (a power of two, equal both ways).
  virtual size_t ring_size() const = 0;
  // The most of our own stream the peer's rx ring may hold unconsumed (a
  // power of two, at most ring_size()): what TCP would buffer this way.
  virtual size_t tx_limit() const { return ring_size(); }

  // Producer side. put() copies into the peer's rx ring at `offset`
  // (offset + len <= ring_size); nothing is promised visible before
  // publish_tail(), which also wakes the peer if it sleeps.
  virtual void put(uint64_t offset, const void* src, size_t len) = 0;
  virtual void publish_tail(uint64_t tail) = 0;
  // The peer's consumer position (credits). Untrusted: RingChannel checks it.
  virtual uint64_t peer_head() = 0;

  // Consumer side. Our rx ring is always local memory.
  virtual const unsigned char* rx_data() const = 0;
  // Where stream position pos is in it, and how many bytes from there are
  // contiguous: one ring, or (verbs) a chain of registered regions.
  virtual const unsigned char* rx_span(uint64_t pos, size_t* contiguous) const {
    uint64_t off = pos & (ring_size() - 1);
    *contiguous = ring_size() - off;
    return rx_data() + off;
  }
  // The peer's producer position. Untrusted: RingChannel checks it.
  virtual uint64_t peer_tail() = 0;
  virtual void publish_head(uint64_t head) = 0;

  // What this side itself last published. Readiness checks from any thread
  // compare them with the peer's cursors, and a process that shares the ring
  // with another (after fork) re-reads them before each operation.
  virtual uint64_t own_tail() const = 0;
  virtual uint64_t own_head() const = 0;

  // Sleeping. wait_fd() becomes readable when the peer published what the
  // sleeper waits for (`what`: kWaitData, a new tail; kWaitSpace, a new
  // head) after prepare_sleep(what). The caller re-checks its condition
  // between prepare_sleep() and sleeping, so no wakeup is lost.
  // finish_sleep(what, rung): rung says wait_fd() was seen readable (or may
  // have been), so it must be drained; a sleeper woken by something else
  // leaves it, and a later sleep wakes once for nothing.
  enum WaitFor : unsigned { kWaitData = 1, kWaitSpace = 2, kWaitAny = 3 };
  virtual int wait_fd() const = 0;
  virtual void prepare_sleep(unsigned what) = 0;
  virtual void finish_sleep(unsigned what, bool rung) = 0;
  // A sleeper that waited edge-triggered (EPOLLET: in the program's epoll
  // set, or in its thread's own, conn/thread_epoll.h) is woken once per
  // ring, so rings left queued wake nobody for nothing: a link may drain
  // them in batches rather than after every sleep.
  virtual void finish_edge_sleep(unsigned what) { finish_sleep(what, false); }
  // Names this link's wait_fd() for a thread's epoll that keeps it
  // registered between sleeps: never reused by another link. 0: wait_fd()
  // is only ever polled.
  virtual uint64_t edge_key() const { return 0; }

  // Asked now and then by a flush that waits: true once the peer is known
  // gone (its socket reset), so nothing can confirm our writes any more.
  // A plain callback, not a class with a vtable: a close may run inside a
  // seccomp sandbox, where a polymorphic type seen for the first time makes
  // UBSan's vptr check call pipe2 (killed by the filter: sandboxed_stream).
  struct PeerWatch {
    bool (*peer_gone)(void* ctx);
    void* ctx;
    bool gone() const { return peer_gone(ctx); }
  };
  // Waits, at most timeout_ms, until everything published so far is in the
  // peer's memory. Before our TCP side closes (the peer takes its FIN as the
  // end of the stream) a link whose writes are asynchronous must drain them.
  // With a watch it stops as soon as the peer is known gone.
  virtual int flush(int /*timeout_ms*/, PeerWatch* /*watch*/ = nullptr) { return 0; }
  // A flush that may go on after the program's close() returned (verbs:
  // confirmations come from another host; one that stopped answering would
  // hold the close for the setup timeout, where TCP's close returns at once).
  // flush(0) then only looks, posting nothing more.
  virtual bool flush_lingers() const { return false; }
  // The peer is known gone (its socket reset), told by someone other than
  // flush's watch: nothing more is posted to it, nothing waited for.
  virtual void peer_lost() {}
  // Called at exit for a link whose writes the exit's flush could not
  // confirm (verbs: they die with our QP, where a TCP socket's send queue
  // would still be delivered): its owner tells the peer the stream was cut.
  // A plain callback (see PeerWatch); the owner clears it ({}) before it
  // goes, or hands the stream to a close's own flush.
  struct ExitNotice {
    void (*cut)(void* ctx) = nullptr;
    void* ctx = nullptr;
  };
  virtual void set_exit_notice(ExitNotice) {}
  // Gives up on our writes not yet confirmed so that they can go another
  // way (the TCP socket: Connection::resend_unconfirmed): nothing more of
  // ours lands in the peer's ring, and *confirmed is where our stream in it
  // ends. Waits at most timeout_ms. -ENOTSUP, or an error when that cannot
  // be known (the caller then resets).
  virtual int abandon_unconfirmed(uint64_t* /*confirmed*/, int /*timeout_ms*/) { return -ENOTSUP; }
  // Our copy of the stream from `pos` on, which abandon_unconfirmed left
  // unconfirmed (*contiguous bytes), or nullptr.
  virtual const unsigned char* staged(uint64_t /*pos*/, size_t* /*contiguous*/) const { return nullptr; }

  // Whether the link's provider moves our bytes on this host's cores (a
  // software RDMA device progresses in the kernel, on the CPU a spinner
  // holds); shared memory needs nothing but the peer. The wait loop yields
  // to such a provider often, and does not take that time for preemption.
  virtual bool provider_on_our_cores() const { return false; }

  // A waiter about to spin (or still spinning) on `cpu` says so, and learns
  // whether the peer's own last wait was on that same CPU: then the peer
  // cannot answer while we hold the core, and the spin yields at every turn
  // (a handoff of a microsecond or two, where a plain spin waits for the
  // scheduler's time slice). Only shared memory has its peer on our cores.
  virtual bool waits_beside_peer(int /*cpu*/) { return false; }

  // Bytes the producer may put now, beyond the ring's credit: a link that
  // stages writes in a smaller buffer (verbs) frees it only as its writes
  // complete. The ring's room is the smaller of both, so a writer waits for
  // it as for credit (asleep on wait_fd, kWaitSpace). May poll and post.
  virtual size_t put_room() { return SIZE_MAX; }

  // A transport failure the link saw (a negative errno), sticky; 0 if none.
  virtual int error() const { return 0; }

  // Elastic memory, for links whose rings are pages both processes map
  // (shared memory): the producer uses only the first `lap` bytes of the
  // ring, growing it when the reader does not drain, and the pages nobody
  // needs go back to the kernel (hole punching). The producer publishes its
  // map word (RingChannel: log2(lap) << 32 | base mod size); other links
  // keep the whole ring, base 0, and their memory.
  virtual bool elastic() const { return false; }
  virtual uint64_t peer_map() { return 0; }  // untrusted: only ever masked
  virtual uint64_t own_map() const { return 0; }
  virtual void publish_map(uint64_t /*word*/) {}
  // Producer: copies len bytes within the peer's rx ring (a lap growing).
  virtual void copy_tx(uint64_t /*dst*/, uint64_t /*src*/, size_t /*len*/) {}
  // Give back the first `len` bytes (page multiples) of the peer's rx ring
  // (producer, ring drained) or of our own (consumer, producer gone for
  // good). False if the kernel refused (then never again).
  virtual bool release_tx(size_t /*len*/) { return false; }
  virtual bool release_rx(size_t /*len*/) { return false; }

  // Elastic registered memory (verbs, verbs/regions.h): the receiver grows
  // its region when the producer reports pressure and shrinks it when
  // drained and idle; the producer adopts what the receiver offers. Runs
  // when the process is about to sleep in our hooks, never per call.
  // tx_owned: the caller holds the send side (nothing put and unposted);
  // rx_owned: the receive side. Returns when it wants to run again (a
  // now_ns() time; 0: no wish).
  virtual bool maintained() const { return false; }
  // Whether maintain() has anything to do now (cheap, any thread): a
  // connection is in the idle registry only while it does.
  virtual bool maintenance_wanted() const { return false; }
  virtual uint64_t maintain(uint64_t /*now*/, bool /*tx_owned*/, bool /*rx_owned*/) { return 0; }
};

}  // namespace rdmashim
