# Link and compute emulation for CPU ranks (docs/emulation.md): EmulatedComm
# against the cluster model on 4 ranks of an emulated 2-node cluster; training
# with emulation gives the losses of the plain run bit for bit, a slow rank
# slows the step and changes no number; bad emulate.* settings stop every rank
# with the key named. (Unit tests: tests/unit/emulate_test.cpp.)
if(NOT TARGET adgt_parallel)
  return()
endif()
set(ADGT_EMU ${CMAKE_CURRENT_SOURCE_DIR}/emulate)
set(ADGT_MPIRUN ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh)

add_executable(adgt_emulated_comm_test ${ADGT_EMU}/emulated_comm_test.cpp)
target_link_libraries(adgt_emulated_comm_test PRIVATE adgt_parallel)
add_test(NAME emulate_comm_np4
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^emulated comm: ok on 4 ranks" --
          timeout 60 ${ADGT_MPIRUN} 4 $<TARGET_FILE:adgt_emulated_comm_test> ${ADGT_EMU}/two_nodes.yaml)
# Lower bounds only (no load makes a sleep shorter); the upper bounds are
# printed, and asserted by scripts/bench.sh (--strict).
set_tests_properties(emulate_comm_np4 PROPERTIES LABELS "parallel;emulate" TIMEOUT 90 PROCESSORS 2)
# The virtual clock: exact times, whatever the machine's load.
add_executable(adgt_virtual_clock_test ${ADGT_EMU}/virtual_clock_test.cpp)
target_link_libraries(adgt_virtual_clock_test PRIVATE adgt_parallel)
add_test(NAME emulate_virtual_clock_np4
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^virtual clock: ok on 4 ranks" --
          timeout 60 ${ADGT_MPIRUN} 4 $<TARGET_FILE:adgt_virtual_clock_test> ${ADGT_EMU}/two_nodes.yaml)
set_tests_properties(emulate_virtual_clock_np4 PROPERTIES LABELS "parallel;emulate" TIMEOUT 90)

if(NOT TARGET adgt-train OR NOT TARGET adgt-data)
  return()
endif()
# Training: each case runs adgt-train twice (tests/emulate/compare_emulated.py).
# The slow rank's case compares step times on the model clock (the same
# ratio under any load).
set(ADGT_EMU_ARGS ${ADGT_PYTHON} ${ADGT_EMU}/compare_emulated.py --train $<TARGET_FILE:adgt-train>
  --mpirun ${ADGT_MPIRUN} --data ${CMAKE_BINARY_DIR}/data/kjv-byte --model ${ADGT_EMU}/model.yaml)
add_test(NAME emulate_train_same_losses_tp2_pp2
  COMMAND ${ADGT_EMU_ARGS} --work ${CMAKE_BINARY_DIR}/emulate/tp2_pp2 --case same
    --layout tp=2,pp=2 --cluster ${ADGT_EMU}/two_nodes.yaml)
add_test(NAME emulate_train_same_losses_tp2_dp2_slow
  COMMAND ${ADGT_EMU_ARGS} --work ${CMAKE_BINARY_DIR}/emulate/tp2_dp2 --case same
    --layout tp=2,dp=2 --cluster ${ADGT_EMU}/two_nodes.yaml --slow-ranks 1:2)
add_test(NAME emulate_train_slow_rank_pp2
  COMMAND ${ADGT_EMU_ARGS} --work ${CMAKE_BINARY_DIR}/emulate/slow --case slow
    --layout pp=2 --ranks 2 --cluster cpu-here --slow-ranks 1:3)
set_tests_properties(emulate_train_same_losses_tp2_pp2 emulate_train_same_losses_tp2_dp2_slow
  emulate_train_slow_rank_pp2 PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel;emulate" TIMEOUT 120 PROCESSORS 2)

# Bad settings: checked before the launch (check_emulation_inputs), reported
# once for the job with the key, exit status 2 on every rank, no hang.
set(ADGT_EMU_BAD ${ADGT_MPIRUN} 2 $<TARGET_FILE:adgt-train>
  --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml --set parallel.dp=2 --set train.global_batch=16
  --set data.train=${CMAKE_BINARY_DIR}/data/kjv-byte/train.bin
  --set data.val=${CMAKE_BINARY_DIR}/data/kjv-byte/val.bin)
add_test(NAME emulate_error_unknown_cluster
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh --once 2
    ".*tiny[.]yaml, --set emulate[.]cluster=[^ ]*: emulate[.]cluster=\"no-such-cluster\": cluster 'no-such-cluster' is neither a preset nor a readable file"
    -- ${ADGT_EMU_BAD} --set emulate.cluster=no-such-cluster)
add_test(NAME emulate_error_cluster_too_small
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh --once 2
    ".*tiny[.]yaml, --set emulate[.]cluster=[^ ]*: emulate[.]cluster=\"[^\"]*one_device[.]yaml\": cluster one-device has 1 devices [(]1 nodes x 1[)] but the run has 2 ranks"
    -- ${ADGT_EMU_BAD} --set emulate.cluster=${ADGT_EMU}/one_device.yaml)
add_test(NAME emulate_error_slow_ranks_syntax
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh --once 2
    ".*emulate[.]slow_ranks: entry 1 \"1-3\" has no ':'"
    -- ${ADGT_EMU_BAD} --set emulate.cluster=cpu-here --set emulate.slow_ranks=1-3)
add_test(NAME emulate_error_slow_rank_outside
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --status 2
    "^error: .*tiny[.]yaml, --set emulate[.]slow_ranks=5:2: emulate[.]slow_ranks=\"5:2\": rank 5 is outside the run's 2 ranks" --
    $<TARGET_FILE:adgt-train> --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml --set parallel.dp=2
      --set train.global_batch=16 --set emulate.cluster=cpu-here --set emulate.slow_ranks=5:2 --dry-run)
set_tests_properties(emulate_error_unknown_cluster emulate_error_cluster_too_small
  emulate_error_slow_ranks_syntax emulate_error_slow_rank_outside PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "config;emulate" TIMEOUT 90 PROCESSORS 2)
