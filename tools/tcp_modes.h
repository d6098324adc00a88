// tcpPingPong --local --connects N / --hold N (see tcp_modes.cc).
#pragma once

#include "pingpong.h"

namespace rdmashim::tools {

// Prints one JSON line; returns an exit code.
int run_connection_mode(const char* tool, const PingPongOptions& o);

}  // namespace rdmashim::tools
