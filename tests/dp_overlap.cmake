# The data-parallel reduction overlapped with the pipeline's backward (started
# at ReduceGrads and unit by unit in a chunk's last fused backward) gives the
# same losses, bit for bit, as starting every bucket after the step
# (parallel.overlap: false): a small run of scripts/bench_dp_overlap.py, which
# also prints the exposed reduction time of both.
if(NOT TARGET adgt-train)
  return()
endif()
foreach(sched 1f1b interleaved)
  add_test(NAME dp_overlap_bitwise_${sched}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "losses bit-identical" --
            ${ADGT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/bench_dp_overlap.py
            --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
            --data ${CMAKE_BINARY_DIR}/data/kjv-byte --schedule ${sched} --rounds 1 --steps 4
            --layers 4 --d-model 64 --ffn 128)
  set_tests_properties(dp_overlap_bitwise_${sched} PROPERTIES
    FIXTURES_REQUIRED kjv_byte LABELS "parallel;pipeline" TIMEOUT 300 PROCESSORS 2)
endforeach()
