// Copies that touch the application's buffers. The kernel answers a bad
// pointer with EFAULT; a plain memcpy in our code would crash the program
// instead. A guarded copy costs a sigsetjmp (no system call): a SIGSEGV or
// SIGBUS inside it, on the user range, returns false, and any other fault
// goes to the handler that was installed before ours (or the default action).
#pragma once

#include <cstddef>

namespace rdmashim {

// Runs fn(arg), which reads or writes [user, user + len) of application
// memory. False if touching that range faulted (fn was cut short).
bool guarded_user_access(const void* user, size_t len, void (*fn)(void*), void* arg);

// memcpy(dst, src, n) where one side is application memory (`user`).
bool copy_user(void* dst, const void* src, size_t n, const void* user);

// Installs the fault handlers now (otherwise at the first guarded copy):
// a seccomp filter that comes later may forbid rt_sigaction.
void prepare_user_copy();

}  // namespace rdmashim
