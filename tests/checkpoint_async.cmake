# Asynchronous checkpoints (checkpoint.async: true; docs/reliability.md,
# "Asynchronous checkpoints"): 4 CPU ranks, tests/checkpoint/async_check.py.
#   checkpoint_async_identical_*  the asynchronous run's checkpoints equal the
#       synchronous run's bit for bit (h5py: datasets and attributes) in tp2/dp2,
#       tp2/dp2 with ZeRO-1 and pp2/dp2; a save is committed at a later step
#       than it was taken; a resume from it reproduces the losses bitwise;
#   checkpoint_async_write_fails  rank 1's background write fails: every rank
#       stops naming the file, the previous checkpoint stays the newest complete;
#   checkpoint_async_sigkill      SIGKILL during an asynchronous save: the
#       previous checkpoint is whole, picked by --resume auto, resumes bitwise.
if(NOT TARGET adgt-train OR NOT TARGET adgt_parallel)
  return()
endif()
set(ADGT_CKPT_ASYNC_ARGS --train $<TARGET_FILE:adgt-train>
  --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh --data ${CMAKE_BINARY_DIR}/data/kjv-byte)
set(ADGT_CKPT_ASYNC ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/async_check.py)
add_test(NAME checkpoint_async_identical_tp2_dp2
  COMMAND ${ADGT_CKPT_ASYNC} identical ${ADGT_CKPT_ASYNC_ARGS} --work ${CMAKE_BINARY_DIR}/checkpoint_async/tp2_dp2
    --layout parallel.tp=2 parallel.dp=2)
add_test(NAME checkpoint_async_identical_zero1
  COMMAND ${ADGT_CKPT_ASYNC} identical ${ADGT_CKPT_ASYNC_ARGS} --work ${CMAKE_BINARY_DIR}/checkpoint_async/zero1
    --layout parallel.tp=2 parallel.dp=2 parallel.zero=1)
add_test(NAME checkpoint_async_identical_pp2
  COMMAND ${ADGT_CKPT_ASYNC} identical ${ADGT_CKPT_ASYNC_ARGS} --work ${CMAKE_BINARY_DIR}/checkpoint_async/pp2
    --layout parallel.pp=2 parallel.dp=2)
add_test(NAME checkpoint_async_write_fails
  COMMAND ${ADGT_CKPT_ASYNC} fail ${ADGT_CKPT_ASYNC_ARGS} --work ${CMAKE_BINARY_DIR}/checkpoint_async/fail)
add_test(NAME checkpoint_async_sigkill
  COMMAND ${ADGT_CKPT_ASYNC} kill ${ADGT_CKPT_ASYNC_ARGS} --work ${CMAKE_BINARY_DIR}/checkpoint_async/kill
    --trials 2)
set_tests_properties(checkpoint_async_identical_tp2_dp2 checkpoint_async_identical_zero1
  checkpoint_async_identical_pp2 checkpoint_async_write_fails checkpoint_async_sigkill PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "checkpoint;parallel" TIMEOUT 300 PROCESSORS 4)
