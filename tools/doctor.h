#pragma once

namespace rdmashim::tools {
// `rdmashim doctor [--json] [--timeout S]`; returns the exit code.
int doctor(int argc, char** argv);
}  // namespace rdmashim::tools
