# The planner (parallel/plan/, docs/planner.md): its unit tests link here; the
# launch-time ctests follow.
target_link_libraries(adgt_unit_tests PRIVATE adgt_plan)

if(NOT TARGET adgt-train OR NOT TARGET adgt-data)
  return()
endif()
# parallel.auto on 8 CPU ranks of the emulated 2-node cluster
# (tests/plan/auto_test.py): the launch plans, trains and matches the
# hand-set layout's losses; a constraint is kept; an infeasible one stops
# every rank with the nearest plans named.
set(ADGT_PLAN_ARGS ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/auto_test.py
  --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
  --data ${CMAKE_BINARY_DIR}/data/kjv-byte)
foreach(case launch constraint infeasible resume)
  add_test(NAME plan_auto_${case}_np8
    COMMAND ${ADGT_PLAN_ARGS} --case ${case} --work ${CMAKE_BINARY_DIR}/plan/${case})
  set_tests_properties(plan_auto_${case}_np8 PROPERTIES
    FIXTURES_REQUIRED kjv_byte LABELS "parallel;plan" TIMEOUT 240 PROCESSORS 2)
endforeach()
# The dry-run table for a cluster we do not have: 70B on 256 H100s (bf16, the
# config's dtype; the device model is deterministic, so the choice is exact).
add_test(NAME plan_dry_run_70b_256_h100
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success
    "^  1 +tp=4 pp=8 dp=8 zero=2 sp=1 zb-h1 mb=1 rc=none .*<- chosen$" --
    $<TARGET_FILE:adgt-train> --config ${CMAKE_SOURCE_DIR}/configs/llama-70b.yaml
    --set parallel.auto=true --dry-run --cluster dgx-h100 --gpus 256)
set_tests_properties(plan_dry_run_70b_256_h100 PROPERTIES LABELS "plan" TIMEOUT 120)
# Re-planning while training (tests/plan/replan_test.py; docs/planner.md
# "Re-planning"): 8 ranks of the emulated 2-node cluster in f64; without a
# straggler the layout stays; with launcher rank 3 16x slower from step 10 the
# planner re-plans for the measured cluster (16x, on the emulation's model
# clock: the same on any machine under any load) and the run switches in
# memory; the losses stay the single process's.
add_test(NAME plan_replan_straggler_np8
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/replan_test.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/plan/replan)
set_tests_properties(plan_replan_straggler_np8 PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel;plan" TIMEOUT 300 PROCESSORS 4 RUN_SERIAL TRUE)
# The same for a link: the pipeline link between launcher ranks 1 and 5 turns
# 16x slower at step 10; the re-plan measures it (and nothing else), switches
# once to a layout predicted faster, and the losses stay the single process's.
add_test(NAME plan_replan_slow_link_np8
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/plan/replan_test.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/plan/replan_link --case link)
set_tests_properties(plan_replan_slow_link_np8 PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel;plan" TIMEOUT 300 PROCESSORS 4 RUN_SERIAL TRUE)
