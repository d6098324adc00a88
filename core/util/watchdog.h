// Provider calls that have been seen to block (a wedged RDMA driver, a dead
// fabric manager) run under a watchdog: on a background thread, waited for
// at most a bound. If the bound passes, the caller goes on without the
// result (the connection stays on TCP) and the thread is left to finish, or
// not, on its own; `if_abandoned` then runs on that thread after `work`, to
// release what `work` made for a caller that is no longer waiting.
#pragma once

#include <cstdint>
#include <functional>

namespace rdmashim {

// True when `work` finished within `ms` (it then ran entirely before the
// return). Without a thread to spare, `work` runs in the caller, unbounded.
bool run_bounded(uint32_t ms, std::function<void()> work, std::function<void()> if_abandoned = nullptr);

}  // namespace rdmashim
