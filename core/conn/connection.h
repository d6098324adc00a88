// One TCP connection that rdmashim may move onto a ring: the upgrade state
// machine and the data path, shared by the preload and the tools.
//
// The application's descriptor stays a real kernel TCP socket. Before the
// switch it carries rdmashim's handshake and framed data; after it, only
// control frames and the final FIN. Each direction switches on its own:
//
//  client                                    server
//  connect ─ Hello ───────────────────────▶  first I/O sees Hello:
//    tx: Framed (DATA frames)                  creates the segment, sends fds
//  ◀──────────────────────────────────────── Ack            tx: Framed
//  reads Ack: maps the segment, marks it    ◀ rx: DATA.. then Switch ─ rx: Ring
//    attached; sends Switch; tx: Ring         sees client attached: sends
//  rx: DATA.. then Switch ─▶ rx: Ring          Switch; tx: Ring
//
// Any failure before a direction switched sends Plain instead, and that
// direction continues as raw TCP: nothing is lost, nothing is duplicated.
// All methods return a count or a negative errno; none throws.
//
// Implemented by concern: connection.cc (creation, state, shutdown and
// close), handshake.cc (Hello/Ack/Params, switching, fallback),
// data_path.cc (recv and send), transfer.cc (recv_to, for splice and
// sendfile), readiness.cc (poll readiness, waiting on the
// doorbell), fork_exec.cc (sharing after fork, handing over across exec)
// and downgrade.cc (leaving the rings for TCP mid-stream).
#pragma once

#include <sys/socket.h>  // MSG_PEEK
#include <sys/uio.h>

#include <atomic>
#include <cerrno>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "discovery/registry.h"
#include "link/transport.h"
#include "ring/ring_channel.h"
#include "shm/rendezvous.h"
#include "sys/calls.h"
#include "util/fd_budget.h"
#include "util/kick.h"
#include "util/stats.h"
#include "util/unique_fd.h"
#include "wire/wire.h"

namespace rdmashim {

namespace verbs {
struct Params;
class VerbsTransport;
}  // namespace verbs

class Connection {
 public:
  enum class Role : uint8_t { kClient, kServer };

  // A connected client socket whose peer advertised rdmashim on this host:
  // sends the Hello. nullptr if nothing was sent (stay plain).
  // `announce`: the client's announcement (discovery::announce_client),
  // kept until the handshake settles. `nonce`: the Hello's nonce when a
  // remote server was told of it before our SYN (discovery::ask_remote).
  static std::unique_ptr<Connection> make_client(int fd, discovery::Announcement announce = {},
                                                 const uint8_t* nonce = nullptr);
  // A freshly accepted socket of a listener under rdmashim. `syn_kept`: the
  // listener keeps SYNs for us (discovery/syn_mark.h), this one's included.
  // `blocking`: accepted without O_NONBLOCK (accept, or accept4 without
  // SOCK_NONBLOCK), so the first read may read before it looks (read_first).
  static std::unique_ptr<Connection> make_server(int fd, bool syn_kept = false, bool blocking = false);
  ~Connection();

  Connection(const Connection&) = delete;
  Connection& operator=(const Connection&) = delete;

  // `calls`: the family of the program's call (sys/calls.h). Every system
  // call made on the socket inside is of that family where it can be.
  // Counted in this process's stats row (two relaxed adds, no system call).
  ssize_t recv(const iovec* iov, int iovcnt, int flags, sys::Calls calls = sys::Calls::kMsg) {
    ssize_t n = recv_stream(iov, iovcnt, flags, calls);
    if (n == -EAGAIN) rx_again_.fetch_add(1, std::memory_order_relaxed);  // an edge while on TCP
    else if (!(flags & MSG_PEEK)) stat_row_.received(n);
    return n;
  }
  ssize_t send(const iovec* iov, int iovcnt, int flags, sys::Calls calls = sys::Calls::kMsg) {
    ssize_t n = send_stream(iov, iovcnt, flags, calls);
    if (n == -EAGAIN) tx_again_.fetch_add(1, std::memory_order_relaxed);
    else stat_row_.sent(n);
    return n;
  }
  // For splice() and sendfile() out of the stream: peeks up to `len` bytes
  // (waiting as recv with `flags` would), hands them to `sink`, which returns
  // how many it took or -errno, and consumes exactly those; repeats without
  // waiting while the sink takes all. Nothing the sink refused leaves the stream.
  using Sink = ssize_t (*)(void* ctx, const void* buf, size_t n);
  ssize_t recv_to(size_t len, int flags, Sink sink, void* ctx);
  // The family of the program's last recv/send here (calls with none of
  // their own, such as splice's, use it).
  sys::Calls last_calls() const { return last_calls_.load(std::memory_order_relaxed); }
  int shutdown(int how);

  // Drives the handshake to its end (either way) within timeout_ms; for the
  // tools, which want the first message already on the ring.
  int finish_setup(int timeout_ms);

  // Readiness, for poll/select/epoll, callable from any thread. `kernel` is
  // what the kernel reported for the TCP socket; the result is what the
  // application should see among `want` (POLLERR/POLLHUP always included).
  short poll_events(short want, short kernel);
  // poll_events() for a fresh server socket the kernel has not been asked
  // about (an epoll registration not made yet): the look for a Hello, a
  // peek that readiness needs anyway, says whether it is readable. -1 when
  // only the kernel can say: the look met the end or an error, took a
  // Hello, or another thread holds the locks.
  short first_look(short want);
  // Some direction is on the ring: the kernel's readiness is not the truth.
  // What to ask of the kernel for the TCP socket when waiting for `want`:
  // directions still on TCP as asked, and on a ring only the TCP side's end.
  short kernel_interest(short want) const;
  bool on_ring() const {
    return rx_ring_.load(std::memory_order_acquire) || tx_ring_.load(std::memory_order_acquire);
  }
  // The doorbell a waiter sleeps on (valid while on_ring()), and the calls
  // that ask the peer to ring it: arm(events) for the poll events a waiter
  // wants returns what it armed, which disarm() takes back; rung: the
  // doorbell was seen readable (drain it). disarm_edge(): the sleep took
  // the doorbell's edge in epoll_wait (EPOLLET), nothing to drain now.
  int doorbell();
  unsigned arm(short events);
  static unsigned arms_for(short events);  // what arm(events) arms
  void disarm(unsigned armed, bool rung);
  void disarm_edge(unsigned armed);
  // A waiter about to sleep while neither direction is on the ring relies
  // on the TCP edge of the peer's Switch to come back and arm() it; a read
  // in another thread may take the Switch first (util/kick.h). It leaves
  // its kick here, then looks at on_ring() again: either it sees the ring,
  // or taking the Switch rings the kick.
  void watch_switch(const std::shared_ptr<Kick>& kick);
  // Counters for edge-triggered epoll. On the ring rx moves when bytes
  // arrive; tx when a write found the ring full (as TCP's EPOLLOUT edge needs
  // SOCK_NOSPACE: credit alone is no edge). While a direction is on TCP they
  // count the calls that found EAGAIN: readiness after one is a new edge (the
  // kernel's own edge is consumed under our tag, shared by the whole set).
  // A value on the ring carries a marker bit, so moving between TCP and the
  // ring never leaves the two counters equal by chance.
  uint64_t rx_progress() const;
  uint64_t tx_progress() const;
  // FIONREAD / SIOCOUTQ on the ring; -1 when the kernel's answer stands.
  int64_t unread_bytes();
  int64_t unsent_bytes() const;
  int64_t unread_before_ring();  // unread_bytes() while rx is not on the ring yet
  // SIOCATMARK on a ring: 1 at the urgent mark, 0 elsewhere; -1 when the kernel's answer stands.
  int at_mark();

  // Before fork(): a connection this process already used and whose
  // handshake is still under way finishes it (bounded, never blocking on a
  // lock), so parent and child inherit a settled connection.
  void settle_before_fork();
  // The same for a connection not used yet (before exec: a client whose
  // Hello is out must take its Ack here, or the next image reads it as data).
  void settle_handshake();
  // A seccomp filter is about to go in: a handshake under way ends now if it
  // can without waiting (a client takes its Ack, a server a Hello already
  // there); one that cannot is left to end on TCP (no upgrade starts from
  // now on). Then the socket's options are read while that is allowed.
  void settle_before_sandbox();
  // Across exec the new image starts with an empty table. A connection that
  // is still exactly as accept() left it (no byte read or written) can be
  // adopted there again; anything further along cannot follow (yet).
  bool untouched_server() const {
    return role_ == Role::kServer && !io_started_.load(std::memory_order_relaxed) && !passthrough();
  }
  // Describes a connection on (or switching to) a ring for the next program
  // image, keeping its transport's descriptors open; "" if it cannot follow
  // exec as it is. The text is parsed by adopt_described() in the new image.
  std::string describe_for_exec();
  static std::unique_ptr<Connection> adopt_described(int fd, const char* text);

  // Before the last close: consumes rdmashim's own frames still waiting on
  // the TCP side (a Switch, a Ping, a Close), never application data. Left
  // unread, they would make the kernel answer the close with RST. A client
  // whose Ack is still due hands its socket to deferred_close.h, at a number
  // outside [avoid_first, avoid_last] (a close_range under way; none by
  // default): kHeld, the socket outlives the program's close. kFlushing:
  // our verbs writes are not all confirmed yet (a peer host that stopped
  // answering); the caller hands the socket and this connection to
  // deferred_close::hold_flushing, which ends the flush with linger_step()
  // and then closes, or, if it cannot, calls finish_flush() before closing.
  enum class Drain { kClose, kHeld, kFlushing };
  Drain drain_before_close(unsigned avoid_first = 1, unsigned avoid_last = 0);
  // After kFlushing: the rest of the flush, here (at most the setup timeout
  // from the close).
  void finish_flush();
  // After kFlushing, in the background: one look at the flush, the TCP side
  // watched on `fd` (the held duplicate: the program's number is closed).
  // true once there is nothing left to wait for.
  // `last`: its deadline passed; the FIN follows.
  bool linger_step(int fd, bool last = false);
  uint64_t close_deadline() const { return close_deadline_; }
  // How long that flush may go on in the background: a reader away from its
  // socket (its receives used up) takes our writes once it is back, as a TCP
  // send queue would still deliver them after close(). Exit and exec wait
  // for it at most the setup timeout (deferred_close::finish_all).
  uint64_t linger_deadline() const { return linger_deadline_; }

  // The preload saw the program set O_NONBLOCK (fcntl F_SETFL, FIONBIO: 0
  // or 1), SO_RCVTIMEO / SO_SNDTIMEO (ns, 0: none) or SO_RCVLOWAT: the new
  // value is kept (-1: ask the kernel next time), and processes sharing the
  // stream after fork are told to ask the kernel again. While a prefix is
  // pending, the new SO_RCVLOWAT is remembered and ours raised again.
  void file_flags_changed(int nonblock = -1);
  void timeouts_changed(int optname = 0, int64_t ns = -1);
  void rcvlowat_changed(int value = -1);
  // Asks the kernel for all of them now, while any call is still allowed
  // (after the handshake, and before a seccomp filter goes in).
  void prime_options();
  // While a prefix is pending SO_RCVLOWAT is ours: the application's value, or -1.
  int app_rcvlowat() const { return app_lowat_.load(std::memory_order_relaxed); }
  // A true prefix of a Hello (or Ack) is waiting for the rest: the now_ns()
  // at which its bytes become the application's; 0 when none. A waiter must
  // not sleep past it (poll_events reports POLLIN once it passed).
  uint64_t prefix_deadline() const { return prefix_deadline_ns_.load(std::memory_order_relaxed); }
  // The now_ns() by which a waiter must look again: the prefix deadline, or
  // while a non-blocking first write is held for an announced client's
  // Hello (await_hello_before_speaking), the hold's end or its next look at
  // the announcement; 0: none.
  uint64_t wake_deadline() const;
  // A non-blocking first write is held at `now` (see wake_deadline()).
  bool holding(uint64_t now) const {
    uint64_t until = hold_until_ns_.load(std::memory_order_relaxed);
    return until > kHoldOver && now < until;
  }
  // A look at readiness found the TCP side readable (a FIN, a control
  // frame; before the ring a Hello, an Ack, a frame or a Switch) while
  // another thread held the locks, so it left it unread. An edge-triggered
  // waiter has spent the kernel's edge for it: before sleeping it calls
  // settle_control(), which reads it now, or says it is still held
  // elsewhere (then the waiter must look again soon).
  bool control_unsettled() const { return control_unsettled_.load(std::memory_order_relaxed); }
  bool settle_control();
  // Before the ring, another thread's read holds the receive lock: it may
  // have taken a Switch (or an Ack) off the socket, which spends the
  // kernel's edge, while the ring's first bytes were published before the
  // waiter armed (so no doorbell rings for them). Asked after arming: a
  // waiter that hears true must look again soon instead of sleeping on.
  bool setup_read_elsewhere();

  // Elastic rings give their pages back when idle, never on the hot path:
  // a write that leaves more than 64 KiB touched lists its connection, and
  // this process's next sleep in our hooks (blocking read or write, poll,
  // select, epoll) releases the listed ones whose reader drained, at most
  // once per 100 ms each. Returns when the next one is due (now_ns() time;
  // 0: none), so a sleep can end then. `held`: a connection whose send lock
  // the caller holds (skipped). Never blocks on a connection's lock.
  static uint64_t release_idle_memory(const Connection* held);
  static bool idle_memory_pending() { return idle_count_.load(std::memory_order_relaxed) != 0; }

  // In a child after fork(): one more process now uses this connection.
  void on_fork_child();

  // Before the real fork() (in the parent) or execve(), for a ring that
  // cannot follow them (verbs) (handover.cc): both directions leave it for
  // TCP now, waiting for the peer's answer up to the setup timeout, and the
  // bytes the peer had put in our ring that we have not read yet move to a
  // shared-memory ring that follows fork and exec. Parent and child (or the
  // new image) then read each byte once, in order, and continue on TCP.
  // `reason`: wire::kDowngradeFork or kDowngradeExec. 0 when done (or
  // nothing to do); a negative errno when the stream stays as it was (the
  // child then sees it as reset), said in a warning.
  int hand_over_ring(uint8_t reason);

  // Moves the connection off its rings back onto the TCP socket, every byte
  // in order (downgrade.cc): our direction leaves with our next send (or at
  // once for a writer waiting for room), and asks the peer to take its
  // direction off with its own next send. `reason`: a wire::DowngradeReason.
  // 0 when under way (or nothing is on a ring), -ENOTSUP if the peer cannot
  // (an older rdmashim), -EBUSY while another process shares the connection.
  int downgrade(uint8_t reason);
  // Some direction left its ring (logged as tcp:downgraded:<reason>).
  bool downgraded() const { return down_dirs_.load(std::memory_order_relaxed) != 0; }

  // Both directions are raw TCP and will stay so: hooks may skip us.
  bool passthrough() const { return passthrough_.load(std::memory_order_relaxed); }
  int fd() const { return fd_.load(std::memory_order_relaxed); }
  // The preload points us at another descriptor of the same socket when the
  // one we used is closed while a duplicate stays open.
  void set_fd(int fd) { fd_.store(fd, std::memory_order_relaxed); }
  Role role() const { return role_; }
  stats::Outcome outcome() const { return outcome_; }
  // How far our ring stream has gone (tests): what a Close frame announces.
  uint64_t tx_ring_position() const { return ring_ ? ring_->tx_position() : 0; }
  const char* transport_name() const;

 private:
  enum class Rx : uint8_t { kRaw, kDetectHello, kAwaitAck, kFramed, kRing };
  enum class Tx : uint8_t { kUndecided, kRaw, kFramed, kRing };
  enum class TxWant : uint8_t { kNone, kRing, kPlain };  // switch at the next frame boundary
  static constexpr int64_t kNoDeadline = -1;
  static constexpr int64_t kDeadlineUnknown = -2;
  static constexpr int kPingIntervalMs = 200;  // liveness probes while a ring stays full
  // What a close waits for its verbs writes to be confirmed before the rest
  // of the wait goes on in the background (Link::flush_lingers): a live
  // peer confirms within microseconds (milliseconds in a TCG guest).
  static constexpr int kCloseFlushMs = 10;
  static constexpr uint64_t kLingerNs = 30'000'000'000;  // linger_deadline()
  static constexpr int kSelfWakeMs = 250;      // a writer waiting on a full ring re-checks shutdown
  static constexpr uint64_t kGrowGraceNs = 10'000'000;  // a full lap waits this long for credit before growing (a descheduled reader is no reason)

  Connection(int fd, Role role);

  // Holds a direction's cross-process lock while another process (a fork)
  // shares the connection, and re-reads the cursors it may have moved.
  class SideLock {
   public:
    SideLock(Connection& c, Transport::Dir d);
    ~SideLock();
    void release();
    void reacquire();

   private:
    Connection& c_;
    Transport::Dir d_;
    bool held_ = false;
  };

  ssize_t recv_stream(const iovec* iov, int iovcnt, int flags, sys::Calls calls);  // data_path.cc
  ssize_t send_stream(const iovec* iov, int iovcnt, int flags, sys::Calls calls);
  stats::Row stat_row_;  // this connection's row in `rdmashim stat`, from settle() on

  // Receive side; rx_mu_ held. Handlers that also change the send side take
  // tx_mu_ themselves unless tx_held_ says this thread holds it already.
  ssize_t recv_some(const iovec* iov, int iovcnt, int flags);
  ssize_t recv_ring(const iovec* iov, int iovcnt, int flags);
  ssize_t recv_ring_empty(int flags);
  ssize_t recv_urgent(const iovec* iov, int iovcnt, int flags);
  ssize_t send_ring_urgent(const iovec* iov, int iovcnt, int flags);
  size_t rcvlowat();                        // SO_RCVLOWAT, at most half the ring
  bool abort_if_data_after_shutdown();      // data after SHUT_RDWR: reset, as TCP does
  // rx_mu_ held. The peer's Close frame said where its stream ends and the
  // ring is not read that far: its FIN is no end yet (announce_end).
  bool awaiting_end() const { return peer_closed_ && ring_->rx_position() < peer_final_; }
  // rx_mu_ held, end_pending_: a peer gone with the writes it announced
  // (its QP too) answers our ping with RST, and the stream ends in that error.
  void probe_announced_end();
  void reached_announced_end();  // rx_mu_ held: read up to the Close frame's end
  int peek_message(const unsigned char (&magic)[8], size_t (*extent)(const unsigned char*),
                   unsigned char (&out)[wire::kMaxHandshakeMessage], size_t* len, int flags, bool may_wait);
  int wait_prefix(size_t have, bool block);
  void end_prefix();
  // Server, both locks held, before the program's first write: 0 to go on,
  // -EAGAIN while a non-blocking write is held for the Hello.
  int await_hello_before_speaking(int flags);
  bool hold_goes_on();  // the hold is still on (ends it if not)
  void end_hold() {
    if (hold_until_ns_.load(std::memory_order_relaxed) > kHoldOver) {
      hold_until_ns_.store(kHoldOver, std::memory_order_relaxed);
    }
  }
  int detect_hello(int flags, bool may_wait);
  // The server's first read straight into the program's buffer (handshake_read.cc).
  const iovec* read_first_into(const iovec* iov, int iovcnt, int flags) const;
  bool read_first(const iovec& into, int flags, ssize_t* result);
  size_t complete_hello(const iovec& into, size_t* have, unsigned char (&msg)[wire::kMaxHandshakeMessage]);
  ssize_t unframe(unsigned char* buf, size_t pos, size_t end);
  void client_is_plain();                              // both locks held
  void take_hello(const unsigned char* msg, size_t len);  // both locks held
  void discard_unread_handshake();
  int await_ack(int flags, bool may_wait);
  int read_frame_bytes(int flags);
  int read_frame(int flags);
  int take_frame();  // acts on the frame in rx_hdr_ and rx_ctl_
  bool poll_control();
  // The send lock for a receive-side handler, unless this thread has it.
  std::unique_lock<std::mutex> lock_tx_for_handler();
  void handle_hello(const wire::Hello& hello, const verbs::Params* params);  // both locks held
  void handle_ack(const wire::Ack& ack, const verbs::Params* params);        // both locks held
  void on_peer_plain();                          // both locks held
  void adopt(std::unique_ptr<Transport> t);      // both locks held
  bool may_follow_exec() const;                  // the socket is not close-on-exec

  // Send side; tx_mu_ held.
  ssize_t send_framed(const iovec* iov, int iovcnt, int flags);
  ssize_t send_ring(const iovec* iov, int iovcnt, int flags);
  // data_follows: the caller sends the program's bytes on TCP right after a
  // Plain frame, so the frame waits for them (MSG_MORE) instead of leaving
  // alone and holding them behind Nagle for the peer's delayed ACK.
  void advance_tx(bool data_follows = false);
  void tx_go_plain();
  void tx_go_ring();
  int send_control(wire::FrameType type, const void* payload, uint32_t len, int more = 0);
  // The socket calls in the program's convention (tcp_io.cc).
  ssize_t tcp_recv(const iovec* iov, int n, int flags);
  ssize_t tcp_send(const iovec* iov, int n, int flags);
  int send_control_bytes(const void* buf, size_t len, int more = 0);

  // Leaving the rings (downgrade.cc).
  enum : uint8_t { kDownTx = 1, kDownAsk = 2 };  // down_want_ bits
  enum : uint8_t { kLeftTx = 1, kLeftRx = 2 };   // down_dirs_ bits
  void apply_tx_downgrade();                     // tx_mu_ held
  ssize_t send_after_downgrade(const iovec* iov, int iovcnt, size_t done, int flags);  // tx_mu_ held
  void on_peer_downgrade(const wire::Downgrade& d);  // rx_mu_ held
  void answer_ask_now();                             // rx_mu_ held (handover.cc)
  bool leave_tx_now(uint8_t flags);                  // both locks held (handover.cc)
  int read_framed_rest(std::vector<unsigned char>* early, uint64_t give_up_ns);  // both locks held
  int await_peer_leave(uint64_t give_up_ns);                                     // both locks held
  int hold_unread(const std::vector<unsigned char>& early, uint64_t* kept);     // both locks held
  bool finish_rx_downgrade();                        // rx_mu_ held: true once rx is raw
  void follow_sibling_downgrade();                   // rx_mu_ held
  bool rx_left_ring() { return rx_leaving_.load(std::memory_order_relaxed) && (rx_ != Rx::kRing || finish_rx_downgrade()); }
  void left_ring(uint8_t dir);
  void note_reason(uint8_t reason);
  std::atomic<bool> peer_downgrades_{false};  // both ends offered Downgrade frames (handshake)
  std::atomic<uint8_t> down_want_{0};         // kDown* bits: our tx should leave at the next step
  std::atomic<uint8_t> down_reason_{0};       // first reason; 0x80 set: the peer's
  std::atomic<uint8_t> down_dirs_{0};         // kLeft* bits
  std::atomic<bool> rx_leaving_{false};       // the peer's Downgrade read: no TCP frames follow
  uint64_t rx_down_pos_ = 0;                  // rx_mu_: where the peer's ring stream ends
  bool down_asked_ = false;                   // tx_mu_: our Ask went out

  // Shared.
  int wait_ring(bool for_write, int64_t deadline_ns, size_t min_bytes = 1);
  void ping_if_due();  // tx_mu_ held
  bool nonblocking(int flags) const;
  bool cacheable() const;
  void options_shared_changed();
  int64_t deadline(int optname) const;
  // Records how the connection ended up (once). `correct`: a server that
  // counted an upgrade learns (the client's Plain) that the client could not
  // attach; the outcome becomes `o` and is reported again.
  void settle(stats::Outcome o, bool correct = false);
  void update_passthrough();  // both locks held
  short consume_setup_bytes(short kernel);
  // closing: the close path, which may ping a peer that sent its FIN to
  // learn it is gone (no ping before a shutdown(): its RST would fail it).
  // The flush's result: 0, -ETIMEDOUT (not confirmed; flush_pending_ if it
  // goes on in the background) or the link's error.
  int flush_tx(bool closing = false);
  // tx_mu_ held, before a FIN that follows ring writes not yet confirmed: a
  // Close frame with our final position, so the peer's end of stream waits
  // for them (its awaiting_end()). Once.
  void announce_end();
  // A close (or the exit) giving up on writes not yet confirmed: they go on
  // TCP instead (resend_unconfirmed), or the FIN becomes a reset.
  void cut_unconfirmed(int fd);
  // The link stops, and the bytes its ring writes did not get confirmed go
  // on the TCP socket `fd` after a Downgrade frame. false: not sent whole
  // (or not tried: a peer that reads no Downgrade, a shared socket).
  bool resend_unconfirmed(int fd);
  // Link::ExitNotice: the exit's flush left writes of ours unconfirmed (the
  // program never closed the socket). Never waits for a lock.
  static void cut_at_exit(void* self);
  void forget_exit_notice();  // the close path, or the connection's end, takes over
  // flush_tx's wait, at most timeout_ms; the close path's with its watch.
  int flush_watched(int timeout_ms, bool closing);
  bool drain_rx(unsigned avoid_first, unsigned avoid_last);  // drain_before_close after the flush
  int epipe(int flags);
  int broken(const char* what);
  void kick_switch_watchers();  // readiness.cc: rx just went on the ring

  // Elastic memory (idle_release.cc). tx_mu_ held for note_tx_dirty.
  static constexpr uint64_t kReleaseIntervalNs = 100'000'000;
  void note_tx_dirty() {
    if (!idle_listed_.load(std::memory_order_relaxed) && (ring_->release_pending() || ring_->maintenance_wanted())) {
      list_idle();
    }
  }
  void note_maintenance() {  // any side: registered memory (verbs) to grow, shrink or adopt
    if (!idle_listed_.load(std::memory_order_relaxed) && ring_ && ring_->maintenance_wanted()) list_idle();
  }
  void list_idle();
  void forget_idle();
  uint64_t release_idle(uint64_t now, bool* done);  // the registry's lock held
  void release_rx_for_good();                        // rx_mu_ held: the producer is gone
  static std::atomic<uint32_t> idle_count_;
  std::atomic<bool> idle_listed_{false};
  uint64_t last_release_ns_ = 0;  // tx_mu_
  bool rx_released_ = false;      // rx_mu_

  std::atomic<int> fd_;
  const Role role_;
  std::mutex rx_mu_;  // order: rx_mu_ before tx_mu_
  std::mutex tx_mu_;
  Rx rx_;
  Tx tx_;
  TxWant tx_want_ = TxWant::kNone;
  bool tx_held_ = false;  // the thread holding rx_mu_ holds tx_mu_ as well
  std::atomic<bool> io_started_{false};
  std::atomic<bool> forked_{false};  // another process may hold the socket too
  std::atomic<bool> in_setup_{true};
  std::atomic<bool> passthrough_{false};
  stats::Outcome outcome_ = stats::Outcome::kTcpNotAdvertised;
  bool settled_ = false;
  const char* detail_ = nullptr;  // said after the outcome in the log ("software rdma rxe0"); static lifetime
  void follow_sibling_switch_rx();  // rx_mu_ held
  void follow_sibling_switch_tx();  // tx_mu_ held
  void follow_sibling_switches();   // neither held (readiness)

  // Handshake material.
  unsigned char nonce_[16] = {};
  unsigned char rendezvous_[shm::kNameBytes] = {};
  UniqueFd rendezvous_fd_;  // the client's rendezvous socket, until the Ack (then its doorbell)
  fds::Promise segment_fds_;  // room kept for the segment's descriptors, until the Ack
  uint32_t server_uid_ = 0;  // the client's: owner of the server's end (sock_diag)
  discovery::Announcement announce_;  // the client's announcement, until settled
  bool syn_kept_ = false;   // server: the client's SYN is ours to read, once (both locks)
  // Server: the socket blocks, as accepted and as set through our hooks since
  // (another process sharing it may have changed that: read_first asks the
  // kernel before it relies on it).
  std::atomic<bool> blocks_{false};
  std::unique_ptr<verbs::VerbsTransport> verbs_;  // the client's offered QP, until the Ack

  // Framing. A header can arrive, or leave, in pieces.
  wire::FrameHeader rx_hdr_{};
  uint32_t rx_hdr_have_ = 0;
  unsigned char rx_ctl_[wire::kMaxControlPayload] = {};
  uint32_t rx_ctl_have_ = 0;
  uint32_t rx_frame_left_ = 0;  // DATA payload bytes still to deliver
  unsigned char tx_hdr_[sizeof(wire::FrameHeader)] = {};
  uint32_t tx_hdr_left_ = 0;    // header bytes not yet sent
  uint32_t tx_frame_left_ = 0;  // DATA payload bytes owed to the open frame

  // The fast path, and what the TCP side said about the peer.
  std::unique_ptr<Transport> transport_;
  std::unique_ptr<RingChannel> ring_;
  // The verbs transport a hand-over replaced (handover.cc): kept until close,
  // as readiness in another thread may still look at it; a forked child
  // leaks its copy (the parent's QP).
  std::unique_ptr<Transport> retired_;
  std::unique_ptr<RingChannel> retired_ring_;
  std::mutex wake_mu_;
  int wake_fd_ = -1;             // our own doorbell, for the readiness hooks
  // Under wake_mu_, rung and let go at the rx Switch (watch_switch): one
  // waiter (an event loop's set), and the rare others.
  std::shared_ptr<Kick> switch_watcher_;
  std::vector<std::shared_ptr<Kick>> more_switch_watchers_;
  std::atomic<const Kick*> last_watcher_{nullptr};  // the last one listed (listed until the Switch)
  bool peer_closed_ = false;     // the peer shut down writing (Close frame) ...
  uint64_t peer_final_ = 0;      // ... after this many bytes
  bool end_announced_ = false;   // our Close frame went (announce_end)
  // After the peer's FIN, the writes its Close frame announced are still on
  // their way (awaiting_end): the reader waits for them, not for the kernel.
  std::atomic<bool> end_pending_{false};
  bool tcp_eof_ = false;         // FIN seen on the TCP side
  int tcp_error_ = 0;            // an error (RST) seen on the TCP side, reported once
  bool orphaned_ = false;  // a forked child's copy of a stream it cannot use
  // The last close's flush (verbs): when it gives up waiting and whether its
  // watch may still ping; flush_pending_: it goes on after close() returned.
  uint64_t close_deadline_ = 0;
  uint64_t linger_deadline_ = 0;
  bool flush_pending_ = false;
  bool close_pinged_ = false;  // the close's watch pinged (once: the answer takes a round trip)
  bool linger_open_ = false;   // no FIN of ours yet: a hang-up is a reset
  bool rst_on_close_ = false;  // unread ring data: the close resets, nothing to flush
  bool parents_transport_ = false;  // a forked child's copy of a transport it must not touch
  bool user_added_for_fork_ = false;  // settle_before_fork counted the child already
  uint64_t last_ping_ns_ = 0;
  std::atomic<bool> tcp_done_{false};   // FIN or error seen: stop polling the socket
  std::atomic<bool> peer_gone_{false};  // the peer's socket is closed: writes fail
  std::atomic<bool> rx_shut_{false};
  std::atomic<bool> tx_shut_{false};
  // Mirrors for lock-free readiness checks.
  std::atomic<bool> rx_ring_{false};     // rx_ == Rx::kRing
  std::atomic<bool> tx_ring_{false};     // tx_ == Tx::kRing
  std::atomic<bool> rx_end_{false};      // a read returns EOF or an error once the ring is drained
  std::atomic<bool> peer_wr_shut_{false};  // the peer will not write again (POLLRDHUP)
  std::atomic<uint64_t> tx_full_{0};       // writes that found the ring full (edge-triggered EPOLLOUT)
  std::atomic<uint64_t> rx_again_{0}, tx_again_{0};  // calls that found EAGAIN (edges while on TCP)
  // What the kernel said, or what the program set through us: -1 unknown.
  // After fork, a process that changes one bumps the transport's options
  // generation and its siblings ask the kernel again.
  mutable std::atomic<int> nonblock_{-1};
  mutable std::atomic<int64_t> rcvtimeo_ns_{-1}, sndtimeo_ns_{-1};  // 0: none
  // The calling convention of the program's last recv/send here: calls made
  // outside one (shutdown, close, poll readiness) use it too.
  std::atomic<sys::Calls> last_calls_{sys::Calls::kMsg};
  // The sharing processes' generation of the values above (Transport).
  mutable std::atomic<uint32_t> options_gen_{0};
  mutable std::atomic<int> rcvlowat_{-1};  // SO_RCVLOWAT; -1: ask the kernel
  // A pending prefix (see prefix_deadline()). SO_RCVLOWAT is raised past it so
  // the kernel wakes nobody until more bytes (or FIN) arrive; lowat_mu_ guards
  // raising, restoring and the application's own setsockopt meanwhile.
  std::atomic<uint64_t> prefix_deadline_ns_{0};
  // The hold of a non-blocking first write (await_hello_before_speaking):
  // 0 none yet, kHoldOver once over, else the now_ns() it ends at. While
  // it lasts the socket is not writable and the kernel is asked about
  // POLLIN instead (the Hello, or the client's end, ends it).
  static constexpr uint64_t kHoldOver = 1;
  static constexpr uint64_t kHoldFirstLookNs = 5'000'000;
  static constexpr int kHoldInCallMs = 1;  // a non-blocking first write's wait before the hold
  std::atomic<uint64_t> hold_until_ns_{0};
  std::atomic<uint64_t> hold_check_ns_{0};  // the next look at the client's announcement
  std::atomic<bool> hold_local_{false};     // announced on this host (else by RDMA-CM)
  std::atomic<bool> writable_told_{false};  // poll_events said POLLOUT before the first write
  std::atomic<bool> control_unsettled_{false};  // see control_unsettled()
  std::atomic<bool> look_saw_bytes_{false};      // the last look for a message found the program's bytes
  std::mutex lowat_mu_;
  std::atomic<int> app_lowat_{-1};         // the application's SO_RCVLOWAT while raised; -1: not raised
  int raised_lowat_ = 0;                   // lowat_mu_: what the kernel has
  int prefix_need_ = 1;                    // lowat_mu_: the prefix's bytes + 1
  std::atomic<uint64_t> shut_tail_{UINT64_MAX};  // peer's tail when both directions were shut
  std::atomic<bool> aborted_{false};       // we reset the connection (data after SHUT_RDWR)
  bool abort_reported_ = false;            // rx_mu_: ECONNRESET handed out once
  // MSG_OOB on a ring, as TCP without SO_OOBINLINE: one urgent byte beside
  // the stream, reads stop at its mark. Written under rx_mu_.
  enum : int { kUrgNone, kUrgValid, kUrgRead };
  std::atomic<int> urg_state_{kUrgNone};
  uint64_t urg_pos_ = 0;
  unsigned char urg_byte_ = 0;
};

}  // namespace rdmashim
