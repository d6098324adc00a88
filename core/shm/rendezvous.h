// Handing the segment's descriptors from server to client.
//
// The client binds a datagram unix socket in the abstract namespace under a
// random name and sends the name inside the TCP connection being upgraded
// (Hello). The server sends the descriptors there with SCM_RIGHTS, in one
// datagram whose payload is the Hello's nonce followed by a random token
// that it also puts in its Ack. Abstract names are listed in /proc/net/unix,
// so anyone may send to the name: a socket filter (classic BPF) on the
// client's socket drops, before they are queued, datagrams that do not start
// with the nonce, which only ever travels inside the TCP stream, so nobody
// else can fill the queue. The client then checks the token and the
// sender's credentials (SCM_CREDENTIALS): the sender's uid must own the
// server's end of the TCP connection. Nothing is created in the file system
// and nothing outlives the two processes.
//
// The two datagram sockets then stay, connected to each other, as the
// connection's doorbells: each side wakes the other by writing one byte on
// its own socket and sleeps on it. Each side created its socket itself and
// holds the only open file description of it, so the peer can neither make
// our writes block (O_NONBLOCK is ours alone; a full queue fails with
// EAGAIN and means a wake is pending already) nor steal what we drain. A
// connected datagram socket accepts datagrams from its peer only.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "util/unique_fd.h"

namespace rdmashim::shm {

constexpr size_t kNameBytes = 16;
constexpr size_t kNonceBytes = 16;
constexpr size_t kTokenBytes = 16;
constexpr int kHandoffFds = 1;  // the segment's memfd

// Client side: the receiving socket, accepting only datagrams that start
// with `nonce`. Returns an invalid fd on failure.
UniqueFd open_rendezvous(unsigned char (&name)[kNameBytes], const unsigned char (&nonce)[kNonceBytes]);

// Server side: delivers the descriptors from a socket of its own, bound and
// connected to the client's, which it keeps as its doorbell (*doorbell).
// Returns 0 or a negative errno.
int send_descriptors(const unsigned char (&name)[kNameBytes], const unsigned char (&nonce)[kNonceBytes],
                     const unsigned char (&token)[kTokenBytes], const int (&fds)[kHandoffFds],
                     UniqueFd* doorbell);

// Server side: tells a client that no Ack follows its Hello (it had shut
// down writing before we answered): one datagram of just the nonce, no
// descriptors. Best effort; nothing is waited for.
void send_refusal(const unsigned char (&name)[kNameBytes], const unsigned char (&nonce)[kNonceBytes]);
// Client side, for a socket held after close (conn/deferred_close.h): 1 if a
// refusal came, 0 if nothing did, -errno; descriptors that came are closed.
int take_refusal(int socket);

// Client side: takes the descriptors that came with the nonce and token from
// a process of user `sender_uid`, discarding anything else. Non-blocking: the
// server sends before its Ack, so by the time the client read the Ack the
// datagram is already queued. On success the socket is connected to the
// server's and its filter removed: it is the client's doorbell from now on.
// Returns 0, -EACCES (a datagram from another user), or another negative errno.
int receive_descriptors(int socket, const unsigned char (&nonce)[kNonceBytes],
                        const unsigned char (&token)[kTokenBytes], uid_t sender_uid, UniqueFd (&out)[kHandoffFds]);

}  // namespace rdmashim::shm
