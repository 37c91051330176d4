# FP8 training (train.dtype: fp8, docs/fp8.md). The casts' bit-exactness and
# the FP8 GEMM's emulation are unit tests (tests/unit/fp8_test.cpp, [fp8]).
if(NOT TARGET adgt-train OR NOT TARGET adgt_parallel)
  return()
endif()
# (layouts.cmake, included after this file, makes the byte-level shards.)
set(ADGT_FP8_DATA ${CMAKE_BINARY_DIR}/data/kjv-byte)
set(ADGT_FP8_ARGS --train $<TARGET_FILE:adgt-train>
  --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh --data ${ADGT_FP8_DATA})
# Every layout against the single fp8 process, within the bf16 layout test's
# bounds (tests/layouts/compare_fp8.py; ~20 s). On the emulated device the
# tp2 SP tensorwise and dp2 delayed (--quick): the device code paths.
add_test(NAME fp8_layouts_match_single_process
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_fp8.py ${ADGT_FP8_ARGS}
    --work ${CMAKE_BINARY_DIR}/fp8_layouts --device cpu)
add_test(NAME fp8_layouts_match_single_process_emulated
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layouts/compare_fp8.py ${ADGT_FP8_ARGS}
    --work ${CMAKE_BINARY_DIR}/fp8_layouts_emulated --device emulated --quick)
set_tests_properties(fp8_layouts_match_single_process fp8_layouts_match_single_process_emulated
  PROPERTIES FIXTURES_REQUIRED kjv_byte LABELS parallel TIMEOUT 600 RUN_SERIAL TRUE)
# 300 steps converge like bf16 (both recipes), bitwise resume, bf16 <-> fp8
# checkpoints (tests/fp8/train_check.py; ~35 s).
add_test(NAME fp8_train_converges_resumes
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/fp8/train_check.py
    --train $<TARGET_FILE:adgt-train> --data ${ADGT_FP8_DATA} --work ${CMAKE_BINARY_DIR}/fp8_train)
set_tests_properties(fp8_train_converges_resumes PROPERTIES FIXTURES_REQUIRED kjv_byte
  TIMEOUT 600 ENVIRONMENT "OMP_NUM_THREADS=1;OPENBLAS_NUM_THREADS=1")
