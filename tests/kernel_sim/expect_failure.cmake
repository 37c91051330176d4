# cmake -DBIN=<mutant test> [-DARGS=<its arguments>] -P expect_failure.cmake:
# passes when the test built against a deliberately broken kernel fails by one
# of its checks ("FAIL ...") or an emulation error ("cuda-sim: ..."); fails
# when it passes, or fails some other way (it did not run, a crash the
# emulation did not name). ADGT_SIM_FAIL_FAST=1: the test stops at its first
# failed check (tests/kernel_sim/sim_check.hpp).
execute_process(COMMAND ${CMAKE_COMMAND} -E env ADGT_SIM_FAIL_FAST=1 ${BIN} ${ARGS} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
string(REGEX MATCH "FAIL [^\n]*" failed "${out}")
string(REGEX MATCH "cuda-sim: [^\n]*" simerr "${err}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the mutant passed: the test does not catch this bug\n${out}")
elseif(failed OR simerr)
  message(STATUS "the mutant failed as it should (${rc}): ${failed}${simerr}")
else()
  message(FATAL_ERROR "the mutant failed, but not by a check (${rc}):\n${out}\n${err}")
endif()
