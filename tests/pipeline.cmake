# Pipeline parallelism: every schedule generator, pp in {2, 4} x micro-batches
# in {pp, 2pp, 3pp}, alone and with tp=2 or dp=2, against the single process
# (tests/pipeline/compare_pipelines.py); 8 CPU ranks at most.
if(NOT TARGET adgt-train OR NOT TARGET adgt_parallel)
  return()
endif()
# Each also on the emulated device (the CUDA code paths; tests/layouts.cmake).
foreach(device cpu emulated)
  set(suffix "")
  if(device STREQUAL "emulated")
    set(suffix "_emulated")
  endif()
  foreach(extra none tp2 dp2)
    add_test(NAME pipeline_match_single_process_${extra}${suffix}
      COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/pipeline/compare_pipelines.py
        --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
        --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/pipeline_${extra}${suffix}
        --extras ${extra} --device ${device})
    set_tests_properties(pipeline_match_single_process_${extra}${suffix} PROPERTIES
      FIXTURES_REQUIRED kjv_byte LABELS "parallel;pipeline" TIMEOUT 1200 RUN_SERIAL TRUE)
  endforeach()
endforeach()
