# Per-rank checkpoints (format version 2) of a mixture-of-experts model with
# expert parallelism, 4 ranks under mpirun (tests/tools/ckpt_expert_test.cpp):
# saves with dp=4 ep=2, dp=4 ep=4, tp=2 x dp=2 ep=2, pp=2 x dp=2 ep=2, a
# non-contiguous expert placement, tp=2 x dp=2 without ep and a mixed dense /
# MoE model; loads each
# (and a version 1 file) into eight layouts with exact comparison, reads whole
# tensors from checkpoint.h5, checks that every expert piece is written once
# and verified by a rank holding it, and the errors (an expert on two ep ranks,
# a missing expert, replicas with different experts, ep not passed, ZeRO-1
# with ep). Then h5py (tests/checkpoint/vds_check.py) reads the virtual
# datasets whole and compares them exactly with the version 1 references.
if(NOT TARGET adgt_parallel)
  return()
endif()
add_executable(adgt_ckpt_expert_test ${CMAKE_CURRENT_SOURCE_DIR}/tools/ckpt_expert_test.cpp)
target_link_libraries(adgt_ckpt_expert_test PRIVATE adgt_core adgt_parallel)

set(ADGT_CKPT_EP_DIR ${CMAKE_BINARY_DIR}/checkpoint_expert)
add_test(NAME checkpoint_expert_np4
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^ckpt-expert: ok" --
          timeout 300 ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 4
          $<TARGET_FILE:adgt_ckpt_expert_test> --dir ${ADGT_CKPT_EP_DIR})
set_tests_properties(checkpoint_expert_np4 PROPERTIES
  FIXTURES_SETUP checkpoint_expert LABELS "checkpoint;parallel;moe" TIMEOUT 330 PROCESSORS 4)

foreach(name dp4_ep2 dp4_ep4 tp2_dp2_ep2 pp2_dp2_ep2 dp4_ep2_scattered tp2_dp2 mixed_pp2_dp2_ep2)
  set(_ref reference)
  if(name MATCHES "^mixed")
    set(_ref reference_mixed)
  endif()
  add_test(NAME checkpoint_expert_h5py_${name}
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/vds_check.py
      --checkpoint ${ADGT_CKPT_EP_DIR}/${name}/step_1 --reference ${ADGT_CKPT_EP_DIR}/${_ref}/step_1
      --tol 0 --layout "ep=")
  set_tests_properties(checkpoint_expert_h5py_${name} PROPERTIES
    FIXTURES_REQUIRED checkpoint_expert LABELS checkpoint TIMEOUT 120)
endforeach()
