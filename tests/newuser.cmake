# What a new user hits (docs/testing.md): the README's adgt-train journeys on
# the CPU with their promised output, exit statuses and files checked (a short
# run and its checkpoint's info, usage and input errors in every tool, a dry
# run that writes nothing, --print-schedule's ranks).
add_test(NAME newuser_walkthrough
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/newuser/walkthrough.sh ${CMAKE_BINARY_DIR}/apps
    ${CMAKE_BINARY_DIR}/data/kjv-byte ${CMAKE_BINARY_DIR}/newuser)
set_tests_properties(newuser_walkthrough PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "config;newuser" TIMEOUT 300 PROCESSORS 2)
# A switch file with a refused line: switch.rejected keeps it with the reason,
# switch.done only what was applied (docs/reliability.md).
add_test(NAME newuser_switch_rejected_np2
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/newuser/switch_rejected.sh $<TARGET_FILE:adgt-train>
    ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh ${CMAKE_CURRENT_SOURCE_DIR}/layouts/model.yaml
    ${CMAKE_BINARY_DIR}/data/kjv-byte ${CMAKE_BINARY_DIR}/newuser_switch)
set_tests_properties(newuser_switch_rejected_np2 PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel;newuser" TIMEOUT 300 PROCESSORS 2)
# The README's planner command: a bf16 plan on the GPUs' memory model whose
# chosen layout's MFU is adgt-sim's for the same inputs within 1%.
add_test(NAME newuser_plan_70b_matches_sim
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/newuser/plan_matches_sim.sh $<TARGET_FILE:adgt-train>
    $<TARGET_FILE:adgt-sim> ${CMAKE_SOURCE_DIR}/configs/llama-70b.yaml)
set_tests_properties(newuser_plan_70b_matches_sim PROPERTIES LABELS "plan;newuser" TIMEOUT 120)
# One forecast: --dry-run of a run on an emulated cluster predicts on that
# cluster with adgt-sim's costs (a profile of this CPU), equal on the model clock.
add_test(NAME newuser_forecast_emulated_cluster
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/newuser/forecast_agree.sh $<TARGET_FILE:adgt-train>
    $<TARGET_FILE:adgt-sim> ${CMAKE_CURRENT_SOURCE_DIR}/compress/model.yaml
    ${CMAKE_CURRENT_SOURCE_DIR}/compress/slow_link.yaml)
set_tests_properties(newuser_forecast_emulated_cluster PROPERTIES LABELS "sim;newuser" TIMEOUT 120)
# The planner's table and --dry-run of its rows agree on CPU ranks (each row
# costed with its own in-situ factor): the chosen row and two whose
# micro-batch or recompute differ.
add_test(NAME newuser_plan_rows_agree
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/newuser/plan_rows_agree.py
    --train $<TARGET_FILE:adgt-train> --model ${CMAKE_CURRENT_SOURCE_DIR}/compress/model.yaml
    --cluster ${CMAKE_CURRENT_SOURCE_DIR}/compress/slow_link.yaml)
set_tests_properties(newuser_plan_rows_agree PROPERTIES LABELS "sim;newuser" TIMEOUT 180)
