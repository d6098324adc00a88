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
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

#include "util/unique_fd.h"

namespace rdmashim::shm {

constexpr size_t kNameBytes = 16;
constexpr size_t kNonceBytes = 16;
constexpr size_t kTokenBytes = 16;
constexpr int kHandoffFds = 3;  // memfd, client doorbell, server doorbell

// Client side: the receiving socket, accepting only datagrams that start
// with `nonce`. Returns an invalid fd on failure.
UniqueFd open_rendezvous(unsigned char (&name)[kNameBytes], const unsigned char (&nonce)[kNonceBytes]);

// Server side: delivers the descriptors. Returns 0 or a negative errno.
int send_descriptors(const unsigned char (&name)[kNameBytes], const unsigned char (&nonce)[kNonceBytes],
                     const unsigned char (&token)[kTokenBytes], const int (&fds)[kHandoffFds]);

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
// datagram is already queued. Returns 0, -EACCES (a datagram from another
// user), or another negative errno.
int receive_descriptors(int socket, const unsigned char (&nonce)[kNonceBytes],
                        const unsigned char (&token)[kTokenBytes], uid_t sender_uid, UniqueFd (&out)[kHandoffFds]);

}  // namespace rdmashim::shm
