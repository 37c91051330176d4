# Hardware telemetry (docs/telemetry.md). The sampler's unit tests
# (tests/unit/telemetry_test.cpp, tag [telemetry], in adgt_unit_tests) read a
# fake NVML built here (tests/telemetry/fake_nvml.c, in full and as an old
# driver without the energy counter, field values and clock-event reasons) and
# fake powercap trees; telemetry_train runs adgt-train on a fake powercap tree
# (1 rank, and 2 ranks of one host: the host's counters read once), with the
# sampler off, and with nothing readable.
add_library(adgt_fake_nvml MODULE ${CMAKE_CURRENT_SOURCE_DIR}/telemetry/fake_nvml.c)
add_library(adgt_fake_nvml_minimal MODULE ${CMAKE_CURRENT_SOURCE_DIR}/telemetry/fake_nvml.c)
target_compile_definitions(adgt_fake_nvml_minimal PRIVATE FAKE_NVML_MINIMAL=1)
add_dependencies(adgt_unit_tests adgt_fake_nvml adgt_fake_nvml_minimal)
set_source_files_properties(${CMAKE_CURRENT_SOURCE_DIR}/unit/telemetry_test.cpp PROPERTIES
  COMPILE_DEFINITIONS "ADGT_FAKE_NVML=\"$<TARGET_FILE:adgt_fake_nvml>\";ADGT_FAKE_NVML_MINIMAL=\"$<TARGET_FILE:adgt_fake_nvml_minimal>\"")

if(NOT TARGET adgt-train OR NOT TARGET adgt-data)
  return()
endif()
add_test(NAME telemetry_train
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/telemetry/telemetry_check.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/telemetry)
set_tests_properties(telemetry_train PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "e2e;telemetry" TIMEOUT 240 PROCESSORS 2)
