// How long a waiter may spin before it sleeps on its doorbell.
//
// Spinning wins only when the peer runs on another core at the same time.
// With more runnable tasks than cores (8 database clients on 2 cores), a
// spinner steals the very CPU its peer needs, so the budget drops to zero
// while the machine is oversubscribed. The run queue is sampled from
// /proc/loadavg at most every 2 ms per process.
#pragma once

#include <cstdint>

namespace rdmashim {

// RDMASHIM_SPIN_US, or 0 while there are more runnable tasks than CPUs.
uint32_t spin_budget_us();

}  // namespace rdmashim
