# The CUDA backend (docs/cuda.md). Its CUDA-vs-CPU tests are Catch2 cases
# (tests/unit/cuda_backend_test.cpp, tag [cuda]) in adgt_unit_tests, each
# registered by catch_discover_tests; without a GPU they check the no-GPU
# behaviour (make_backend("cuda") errors, "auto" is the CPU) and skip the rest.
# Here: the one-call GPU check script parses and finds every file it uses.
# Its bundle and run modes are not ctests (a ~10-minute build; a GPU).
find_program(ADGT_BASH bash)
if(NOT ADGT_BASH)
  return()
endif()
add_test(NAME cuda_check_script_syntax
  COMMAND ${ADGT_BASH} -n ${CMAKE_SOURCE_DIR}/scripts/device/check.sh)
add_test(NAME cuda_check_script_paths
  COMMAND ${ADGT_BASH} ${CMAKE_SOURCE_DIR}/scripts/device/check.sh paths)
set_tests_properties(cuda_check_script_syntax cuda_check_script_paths
  PROPERTIES LABELS cuda TIMEOUT 30)
