# Tests that currently show a divergence from plain TCP (or a failure) that
# rdmashim does not handle yet. They are built and can be run by hand
# (`ctest -R NAME`, or tests/diff/run_diff.sh NAME); ctest lists them as
# "Not Run (Disabled)" until the library is fixed and the name leaves this
# list. This list is the open work of issue 4; keep it short and honest.
set(RDMASHIM_KNOWN_FAILURES
  # readiness: epoll corner cases (error codes, EPOLLEXCLUSIVE, nesting,
  # timeouts, fairness, edge-triggered echo loop), ppoll, peer close in poll
  diff.ppoll_basic diff.poll_peer_close diff.loop_epoll_et_echo diff.epoll_lt_basic diff.epoll_ctl_errors
  diff.epoll_exclusive diff.epoll_maxevents_fairness diff.epoll_timeouts diff.epoll_nested
  # a socket registered in epoll, or connected, before its upgrade settles
  asio.preload asio.preload_native_connect asio.epoll_before_connect.preload asio.epoll_handshake_edge.preload
  # non-blocking connect to a refused port; SO_RCVLOWAT
  diff.nonblock_connect_refused diff.so_rcvlowat
  # argument checking on the ring path: zero-length, EFAULT, MSG_OOB
  diff.io_zero_length diff.io_efault diff.io_msg_oob
  # shutdown(SHUT_RD/SHUT_RDWR) and abortive close (RST) semantics on a ring
  diff.shutdown_rd diff.shutdown_rdwr diff.close_linger0_rst diff.close_unread_rst diff.close_range_reuse
  # fork-per-connection, prefork and daemonize transcripts; exec of an unused socket
  diff.proc_fork_per_conn diff.proc_prefork diff.proc_daemonize diff.proc_exec_inherit_cold
  # write-then-close still sometimes ends in RST instead of EOF (an unread
  # control frame racing the close), seen in these intermittently
  diff.addr_ipv6_loopback diff.addr_dualstack_v4_client diff.addr_wildcard_v4 diff.addr_own_interface_ip
  diff.addr_client_binds_first diff.proc_exec_listener
  # intermittent: a spurious or stale edge/level event after a wait
  diff.epoll_et_out diff.nonblock_connect_epoll
  # the _FORTIFY_SOURCE build of the scenarios
  diff.fortify_chk
  # answer-then-close: the client's Switch can reach a server that already
  # closed; its RST makes the client's kernel drop the unread reply (TCPAbortOnData)
  stress.close_after_response.preload
)

# Called at the end of each test folder's CMakeLists.
function(rdmashim_disable_known_failures)
  foreach(t ${RDMASHIM_KNOWN_FAILURES})
    if(TEST ${t})
      set_tests_properties(${t} PROPERTIES DISABLED TRUE)
    endif()
  endforeach()
endfunction()
