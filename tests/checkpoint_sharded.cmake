# Checkpoint format version 2 with several ranks (docs/checkpoint-format.md):
# damaged checkpoints stop every rank with the file and tensor named, and
# saves survive SIGKILL of any rank. The cross-layout resumes and the h5py
# reader are part of layouts_match_single_process (tests/layouts.cmake); the
# one-process cases are unit tests (tests/unit/checkpoint_sharded_test.cpp).
if(NOT TARGET adgt-train OR NOT TARGET adgt_parallel)
  return()
endif()

# Benchmark driver for scripts/bench_checkpoint.sh (no test of its own).
add_executable(adgt_checkpoint_bench ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/bench_tool.cpp)
target_link_libraries(adgt_checkpoint_bench PRIVATE adgt_core adgt_parallel)

# The byte-level corpus of the layout tests (fixture kjv_byte, tests/layouts.cmake).
set(ADGT_CKPT_DATA ${CMAKE_BINARY_DIR}/data/kjv-byte)
add_test(NAME checkpoint_damaged_all_ranks
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/integrity_check.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${ADGT_CKPT_DATA} --work ${CMAKE_BINARY_DIR}/checkpoint_integrity)
add_test(NAME checkpoint_sigkill_during_save
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/kill_check.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${ADGT_CKPT_DATA} --work ${CMAKE_BINARY_DIR}/checkpoint_kill --trials 3)
set_tests_properties(checkpoint_damaged_all_ranks checkpoint_sigkill_during_save PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "checkpoint;parallel" TIMEOUT 240 PROCESSORS 4)
