# Tests that currently show a divergence from plain TCP (or a failure) that
# rdmashim does not handle yet. They are built and can be run by hand
# (tests/diff/run_diff.sh NAME, or a build configured with
# -DRDMASHIM_RUN_KNOWN_FAILURES=ON); ctest lists them as
# "Not Run (Disabled)" until the library is fixed and the name leaves this
# list. This list is the open work of issue 4; keep it short and honest.
set(RDMASHIM_KNOWN_FAILURES
  # A server socket forked before its handshake, used by both processes:
  # the child's look takes the Hello and upgrades, and the parent, which
  # kept its copy, reads the client's frames as bytes (or waits on a TCP
  # side the client no longer writes).
  diff.epoll_fresh_fork diff_nospin.epoll_fresh_fork
  diff.poll_fresh_fork diff_nospin.poll_fresh_fork
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
