# Tests that currently show a divergence from plain TCP (or a failure) that
# rdmashim does not handle yet. They are built and can be run by hand
# (tests/diff/run_diff.sh NAME, or a build configured with
# -DRDMASHIM_RUN_KNOWN_FAILURES=ON); ctest lists them as
# "Not Run (Disabled)" until the library is fixed and the name leaves this
# list. This list is the open work of issue 4; keep it short and honest.
set(RDMASHIM_KNOWN_FAILURES
  # non-blocking connect to a refused port; SO_RCVLOWAT
  diff.nonblock_connect_refused diff.so_rcvlowat
  # argument checking on the ring path: zero-length, EFAULT, MSG_OOB
  diff.io_zero_length diff.io_efault diff.io_msg_oob
  # shutdown(SHUT_RD/SHUT_RDWR) and abortive close (RST) semantics on a ring
  diff.shutdown_rd diff.shutdown_rdwr diff.close_linger0_rst diff.close_unread_rst diff.close_range_reuse
  # exec of an unused socket
  diff.proc_exec_inherit_cold
  # intermittent (1 in 10 to 15 runs): daemonize transcript
  diff.proc_daemonize
)

# Called at the end of each test folder's CMakeLists.
# -DRDMASHIM_RUN_KNOWN_FAILURES=ON runs them anyway (to see which now pass).
function(rdmashim_disable_known_failures)
  if(RDMASHIM_RUN_KNOWN_FAILURES)
    return()
  endif()
  foreach(t ${RDMASHIM_KNOWN_FAILURES})
    if(TEST ${t})
      set_tests_properties(${t} PROPERTIES DISABLED TRUE)
    endif()
  endforeach()
endfunction()
