// Private to core/conn/: helpers the files that implement Connection
// (connection.cc, handshake.cc, data_path.cc, ...) share. Not for use
// outside core/conn/.
#pragma once

#include <cstddef>

namespace rdmashim::conn_internal {

// Sends all of buf, waiting for room up to the setup timeout even on a
// non-blocking socket: used only for rdmashim's own small messages.
int send_all(int fd, const void* buf, size_t len);

// The bytes of an Ack or a Hello (and the Params frame it may carry)
// starting at m, whose first 64 bytes are there.
size_t ack_extent(const unsigned char* m);
size_t hello_extent(const unsigned char* m);

}  // namespace rdmashim::conn_internal
