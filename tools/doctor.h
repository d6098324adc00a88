#pragma once

#include <string>
#include <utility>
#include <vector>

namespace rdmashim::tools {
// `rdmashim doctor [--json] [--timeout S]`; returns the exit code.
int doctor(int argc, char** argv);

// One step's outcome: ok, and "<step> <detail>".
using DoctorLine = std::pair<bool, std::string>;
// The settings and what shared memory between two local processes needs
// (doctor_same_host.cc): none of it can block, so it runs in the command.
std::vector<DoctorLine> same_host_checks();
}  // namespace rdmashim::tools
