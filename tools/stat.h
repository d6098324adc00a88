#pragma once

namespace rdmashim::tools {
// `rdmashim stat [--json] [--watch [SECONDS] [--count N]]`; returns the exit code.
int stat(int argc, char** argv);
}  // namespace rdmashim::tools
