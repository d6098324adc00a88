// Handing the segment's descriptors from server to client.
//
// The client opens a one-shot abstract unix socket under a random name and
// sends the name inside the TCP connection being upgraded (Hello). The server
// connects to it and sends the descriptors with SCM_RIGHTS, together with a
// random token that it also puts in its Ack. Abstract names are listed in
// /proc/net/unix, so the name is not a secret: the token, which only ever
// travels inside the TCP stream, is what the client checks. Nothing is
// created in the file system and nothing outlives the two processes.
#pragma once

#include <cstddef>
#include <cstdint>

#include "util/unique_fd.h"

namespace rdmashim::shm {

constexpr size_t kNameBytes = 16;
constexpr size_t kTokenBytes = 16;
constexpr int kHandoffFds = 3;  // memfd, client doorbell, server doorbell

// Client side: the listening socket. Returns an invalid fd on failure.
UniqueFd open_rendezvous(unsigned char (&name)[kNameBytes]);

// Server side: delivers the descriptors. Returns 0 or a negative errno.
int send_descriptors(const unsigned char (&name)[kNameBytes], const unsigned char (&token)[kTokenBytes],
                     const int (&fds)[kHandoffFds]);

// Client side: takes the descriptors that arrived with the right token,
// discarding any connection that did not bring it. Non-blocking: the server
// connects before it sends its Ack, so by the time the client read the Ack
// the descriptors are already queued. Returns 0 or a negative errno.
int receive_descriptors(int listener, const unsigned char (&token)[kTokenBytes], UniqueFd (&out)[kHandoffFds]);

}  // namespace rdmashim::shm
