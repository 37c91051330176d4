# Timelines (docs/trace.md): log.trace's Chrome trace of a pp4 x dp2 run on an
# emulated DGX H100 (model clock) and adgt-sim --trace of the same layout
# (tests/trace/check_trace.py: the 1F1B instructions per rank, spans covering
# >= 99.5% of each step, the simulator's names alike, losses unchanged by tracing).
if(NOT TARGET adgt-train OR NOT TARGET adgt-sim)
  return()
endif()
add_test(NAME trace_timeline_pp4_dp2
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/trace/check_trace.py
    --train $<TARGET_FILE:adgt-train> --sim $<TARGET_FILE:adgt-sim>
    --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --config ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml
    --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/trace_timeline)
set_tests_properties(trace_timeline_pp4_dp2 PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel;trace" TIMEOUT 300 PROCESSORS 2)

# The power model (docs/power.md): adgt-sim --power-cap, emulate.power_cap_w on
# the model clock and the power controller's decisions (tests/power/check_power.py).
add_test(NAME power_cap_emulated_np2
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/power/check_power.py
    --train $<TARGET_FILE:adgt-train> --sim $<TARGET_FILE:adgt-sim>
    --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh --source ${CMAKE_SOURCE_DIR}
    --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/power_cap
    --fake-nvml $<TARGET_FILE:adgt_fake_nvml>)
set_tests_properties(power_cap_emulated_np2 PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel;power" TIMEOUT 300 PROCESSORS 2)
