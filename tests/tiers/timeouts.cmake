# Test timeouts are hang guards, not speed checks (docs/testing.md): each
# module sets a TIMEOUT about 10x its test's time alone, and here every one is
# scaled to ADGT_TEST_TIMEOUT_PERCENT (default 250%), so that a suite slowed
# by load still finishes — beside two busy-loop processes on 2 cores the tp2
# pipeline sweep took 8.5x its time alone (420 s against 49 s). A test without
# a TIMEOUT keeps ctest's default (1500 s).
set(ADGT_TEST_TIMEOUT_PERCENT 250 CACHE STRING
    "every test's TIMEOUT in percent of its module's (hang guards; raise it on a slow or shared machine)")
get_property(_adgt_tests DIRECTORY PROPERTY TESTS)
foreach(_t ${_adgt_tests})
  get_test_property(${_t} TIMEOUT _timeout)
  if(_timeout)
    math(EXPR _scaled "${_timeout} * ${ADGT_TEST_TIMEOUT_PERCENT} / 100")
    set_tests_properties(${_t} PROPERTIES TIMEOUT ${_scaled})
  endif()
endforeach()
