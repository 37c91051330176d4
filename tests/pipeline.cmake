# Pipeline parallelism: every schedule generator, pp in {2, 4} x micro-batches
# in {pp, 2pp, 3pp}, alone and with tp=2 or dp=2, against the single process
# (tests/pipeline/compare_pipelines.py); 8 CPU ranks at most.
if(NOT TARGET adgt-train OR NOT TARGET adgt_parallel)
  return()
endif()
# On the emulated device: the schedules of each instruction kind (below;
# extras none) at m = 2pp, and the checkpoint reshards; tp2 and dp2 with the pipeline run on the cpu only (the
# emulated layout sweep covers tp and dp). The device paths a schedule takes
# (staged messages, buffers held per micro-batch in flight) are the same at
# m = pp and 3pp, which the cpu runs cover for the schedules themselves.
# With tp2 and dp2, m = pp (no steady state) and 3pp (the longest one): the
# schedules at 2pp run alone above. The suite's time budget (~25 minutes) is
# better spent elsewhere.
foreach(extra none tp2 dp2)
  set(devices cpu emulated)
  if(NOT extra STREQUAL "none")
    set(devices cpu)
  endif()
  foreach(device ${devices})
    set(ms 1 2 3)
    set(schedules)
    if(device STREQUAL "emulated")
      set(ms 2)
      # The device paths of a schedule are its instruction kinds: a fused
      # backward (1f1b), two chunks per rank (interleaved), the split backward
      # (zb-h1) and both with the vee placement (zb-v). gpipe and greedy run
      # those same kinds in other orders (the cpu sweep and the rendezvous
      # lists cover the orders).
      set(schedules --schedules 1f1b interleaved zb-h1 zb-v)
    elseif(NOT extra STREQUAL "none")
      set(ms 1 3)
    endif()
    adgt_sweep_on_devices(NAME pipeline_match_single_process_${extra} DEVICES ${device}
      WORK ${CMAKE_BINARY_DIR}/pipeline_${extra} TIMEOUT 1200 LABELS parallel pipeline
      COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/pipeline/compare_pipelines.py
        --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
        --data ${CMAKE_BINARY_DIR}/data/kjv-byte --extras ${extra} --m-per-pp ${ms} ${schedules})
  endforeach()
endforeach()
# The lists the executor runs on NCCL (pp::for_rendezvous: receives moved to
# the messages' global order), run over MPI: the same numbers as the single
# process. The schedules whose lists it changes most (interleaved, greedy,
# greedy over two chunks per rank, zb-v with its in-memory turn on rank pp-1).
add_test(NAME pipeline_match_single_process_rendezvous
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/pipeline/compare_pipelines.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${CMAKE_BINARY_DIR}/data/kjv-byte --extras none --schedules interleaved greedy greedy-v2 zb-h1 zb-v
    --m-per-pp 1 3 --rendezvous --work ${CMAKE_BINARY_DIR}/pipeline_rendezvous)
set_tests_properties(pipeline_match_single_process_rendezvous PROPERTIES TIMEOUT 1200
  LABELS "parallel;pipeline" FIXTURES_REQUIRED kjv_byte RUN_SERIAL TRUE)
# zb-v's V-shaped placement as the run prints it (rank 0 holds the first and
# the last stage), and its chunk-count rule as a named config error.
add_test(NAME pipeline_print_schedule_zb_v
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^  stage 7 \\(pipeline rank 0, chunk 1\\): layers 7\\.\\.7 \\+ final norm"
    -- $<TARGET_FILE:adgt-train> --config ${CMAKE_CURRENT_SOURCE_DIR}/pipeline/model.yaml --print-schedule
    --set parallel.pp=4 --set parallel.schedule=zb-v --set parallel.virtual_stages=2 --set train.global_batch=8)
add_test(NAME pipeline_zb_v_bad_chunks
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh
    "parallel.virtual_stages=4: the zb-v schedule places exactly 2 chunks per rank"
    -- $<TARGET_FILE:adgt-train> --config ${CMAKE_CURRENT_SOURCE_DIR}/pipeline/model.yaml --print-schedule
    --set parallel.pp=4 --set parallel.schedule=zb-v --set parallel.virtual_stages=4)
# With tp and dp, each pipeline rank's world ranks (layout order: tp fastest,
# then dp, then pp): pp=2 x dp=2 x tp=2, pipeline rank 1 = world ranks 4..7.
add_test(NAME pipeline_print_schedule_world_ranks
  COMMAND bash ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^  pipeline rank 1 = world ranks 4,5,6,7 [(]tp=2 x dp=2[)]$"
    -- $<TARGET_FILE:adgt-train> --config ${CMAKE_CURRENT_SOURCE_DIR}/pipeline/model.yaml --print-schedule
    --set parallel.pp=2 --set parallel.tp=2 --set parallel.dp=2 --set train.global_batch=16)
set_tests_properties(pipeline_print_schedule_world_ranks PROPERTIES TIMEOUT 60 LABELS "pipeline;schedule")
set_tests_properties(pipeline_print_schedule_zb_v pipeline_zb_v_bad_chunks PROPERTIES TIMEOUT 60
  LABELS "pipeline;schedule")
