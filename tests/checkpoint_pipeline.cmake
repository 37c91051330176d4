# Per-rank checkpoints (format version 2) with pipeline parallelism, 4 ranks
# under mpirun (tests/tools/ckpt_pipeline_test.cpp): saves with pp=2 x tp=2,
# pp=4, pp=2 x dp=2 ZeRO-1, interleaved stages and pp=1, loads each (and a
# version 1 file) into seven layouts with exact comparison, reads whole tensors
# from checkpoint.h5, checks that every piece's checksum is verified and the
# errors (a tensor on two stages, a missing or unloaded tensor). Then h5py
# (tests/checkpoint/vds_check.py) reads the pipeline checkpoints' virtual
# datasets whole and compares them exactly with the version 1 reference.
if(NOT TARGET adgt_parallel)
  return()
endif()
add_executable(adgt_ckpt_pipeline_test ${CMAKE_CURRENT_SOURCE_DIR}/tools/ckpt_pipeline_test.cpp)
target_link_libraries(adgt_ckpt_pipeline_test PRIVATE adgt_core adgt_parallel)

set(ADGT_CKPT_PP_DIR ${CMAKE_BINARY_DIR}/checkpoint_pipeline)
add_test(NAME checkpoint_pipeline_np4
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^ckpt-pipeline: ok" --
          timeout 300 ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 4
          $<TARGET_FILE:adgt_ckpt_pipeline_test> --dir ${ADGT_CKPT_PP_DIR})
set_tests_properties(checkpoint_pipeline_np4 PROPERTIES
  FIXTURES_SETUP checkpoint_pipeline LABELS "checkpoint;parallel" TIMEOUT 330 PROCESSORS 4)

foreach(name pp2_tp2 pp4 pp2_dp2_zero pp2_tp2_interleaved)
  add_test(NAME checkpoint_pipeline_h5py_${name}
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/vds_check.py
      --checkpoint ${ADGT_CKPT_PP_DIR}/${name}/step_1 --reference ${ADGT_CKPT_PP_DIR}/reference/step_1
      --tol 0 --layout pp=)
  set_tests_properties(checkpoint_pipeline_h5py_${name} PROPERTIES
    FIXTURES_REQUIRED checkpoint_pipeline LABELS checkpoint TIMEOUT 120)
endforeach()
