# Every data/tensor-parallel layout against the single process (8 CPU ranks at
# most, mpirun --oversubscribe), on byte-level shards of the default corpus.
if(NOT TARGET adgt-train OR NOT TARGET adgt-data OR NOT TARGET adgt_parallel)
  return()
endif()
set(ADGT_KJV_BYTE ${CMAKE_BINARY_DIR}/data/kjv-byte)
add_test(NAME layouts_prepare_bytes
  COMMAND ${CMAKE_COMMAND} -E env ADGT_TOKENIZER=byte
    ${CMAKE_SOURCE_DIR}/scripts/prepare_data.sh ${ADGT_KJV_BYTE} $<TARGET_FILE:adgt-data>)
set_tests_properties(layouts_prepare_bytes PROPERTIES FIXTURES_SETUP kjv_byte)
add_test(NAME layouts_match_single_process
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_layouts.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${ADGT_KJV_BYTE} --work ${CMAKE_BINARY_DIR}/layouts)
set_tests_properties(layouts_match_single_process PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel" TIMEOUT 1500 RUN_SERIAL TRUE)

# The same run through srun on a real (private, single-node) Slurm cluster gives
# the mpirun losses bit for bit.
add_test(NAME layouts_srun_matches_mpirun
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm/with_slurm.sh --
    ${CMAKE_CURRENT_SOURCE_DIR}/layouts/srun_vs_mpirun.sh $<TARGET_FILE:adgt-train>
    ${ADGT_KJV_BYTE} ${CMAKE_BINARY_DIR}/layouts_srun)
set_tests_properties(layouts_srun_matches_mpirun PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "parallel;slurm" TIMEOUT 300 RUN_SERIAL TRUE)

# Bad launches of adgt-train itself: every rank names the cause, exits non-zero, no hang.
add_test(NAME layouts_error_world_size
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh 3
    ".*tiny[.]yaml: parallel[.]tp=2 x pp=1 x dp=2 = 4 ranks, but the launch has 3"
    -- ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 3 $<TARGET_FILE:adgt-train>
       --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml --set parallel.tp=2 --set parallel.dp=2
       --set train.global_batch=16)
add_test(NAME layouts_error_missing_shard_all_ranks
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh 2
    "data[.]train: token shard '/nonexistent/train.bin' does not exist"
    -- ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 2 $<TARGET_FILE:adgt-train>
       --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml --set parallel.dp=2
       --set train.global_batch=16 --set data.train=/nonexistent/train.bin)
add_test(NAME layouts_error_unknown_launcher
  COMMAND ${CMAKE_COMMAND} -E env RANK=0 WORLD_SIZE=2 LOCAL_RANK=0
    ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh "unknown launcher"
    -- $<TARGET_FILE:adgt-train> --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml)
set_tests_properties(layouts_error_world_size layouts_error_missing_shard_all_ranks
  layouts_error_unknown_launcher PROPERTIES LABELS parallel TIMEOUT 90)

# A stop signal to any rank, or SIGUSR1 to mpirun (Open MPI forwards SIGUSR1 and
# SIGUSR2 to every rank; SIGTERM to mpirun makes mpirun itself tear the job
# down, so send SIGTERM to the ranks or SIGUSR1 to mpirun): every rank saves at
# the same step, exit 0, and the checkpoint resumes.
foreach(case "TERM;rank" "USR1;mpirun" "USR1;rank")
  list(GET case 0 sig)
  list(GET case 1 to)
  add_test(NAME layouts_signal_${sig}_to_${to}
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/parallel/signal_mpirun.py
      --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
      --data ${ADGT_KJV_BYTE} --work ${CMAKE_BINARY_DIR}/signals --signal ${sig} --to ${to})
  set_tests_properties(layouts_signal_${sig}_to_${to} PROPERTIES
    FIXTURES_REQUIRED kjv_byte LABELS parallel TIMEOUT 300)
endforeach()

# bf16 mixed precision under pp (bitwise), dp, ZeRO-1, tp and SP against the
# single bf16 process (tests/layouts/compare_bf16.py; ~20 s).
add_test(NAME layouts_bf16_match_single_process
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_bf16.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/layouts_bf16)
set_tests_properties(layouts_bf16_match_single_process PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS parallel TIMEOUT 600 RUN_SERIAL TRUE)
