# The mixture-of-experts block (core/model/moe.hpp): expert parallelism at 1, 2 and
# 4 ranks against one process on the union of the tokens
# (tests/tools/moe_ep_test.cpp), and the layer against an independent PyTorch
# float64 implementation (tests/torch/moe_ref.py, fed by adgt-moe-dump). The
# finite-difference and hand-made cases are Catch2 tests in tests/unit/moe_test.cpp.
add_executable(adgt-moe-dump ${CMAKE_CURRENT_SOURCE_DIR}/tools/moe_dump.cpp)
target_link_libraries(adgt-moe-dump PRIVATE adgt_core CLI11::CLI11)
foreach(dt f32 f64)
  add_test(NAME moe_torch_${dt}
    COMMAND ${CMAKE_COMMAND} -E env OMP_NUM_THREADS=2 sh -c
      "$<TARGET_FILE:adgt-moe-dump> --out moe_${dt}.h5 --dtype ${dt} && ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/moe_ref.py moe_${dt}.h5"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(moe_torch_${dt} PROPERTIES LABELS "torch;moe" TIMEOUT 120)
endforeach()

if(NOT TARGET adgt_parallel)
  return()
endif()
add_executable(adgt_moe_ep_test ${CMAKE_CURRENT_SOURCE_DIR}/tools/moe_ep_test.cpp)
target_link_libraries(adgt_moe_ep_test PRIVATE adgt_parallel)
foreach(n 1 2 4)
  add_test(NAME moe_ep_np${n}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^moe-ep: ok on ${n} ranks" --
            timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh ${n} $<TARGET_FILE:adgt_moe_ep_test>)
  set_tests_properties(moe_ep_np${n} PROPERTIES LABELS "parallel;moe" TIMEOUT 150 PROCESSORS 2)
endforeach()

# The model with MoE layers under every expert-parallel layout against the
# single process (tests/moe/compare_experts.py), and bad expert settings:
# a named error on every rank, exit 2.
if(NOT TARGET adgt-train)
  return()
endif()
# Also on the emulated device (the CUDA code paths; tests/layouts.cmake).
adgt_sweep_on_devices(NAME moe_layouts_match_single_process WORK ${CMAKE_BINARY_DIR}/moe_layouts
  TIMEOUT 600 LABELS parallel moe
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/moe/compare_experts.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${CMAKE_BINARY_DIR}/data/kjv-byte)
set(ADGT_MOE_YAML ${CMAKE_CURRENT_SOURCE_DIR}/moe/model.yaml)
function(adgt_moe_error name ranks regex)
  add_test(NAME moe_error_${name}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh --once ${ranks} ".*${regex}" --
      ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh ${ranks} $<TARGET_FILE:adgt-train>
      --config ${ADGT_MOE_YAML} ${ARGN})
  set_tests_properties(moe_error_${name} PROPERTIES LABELS "moe;config" TIMEOUT 90)
endfunction()
adgt_moe_error(replicas_owner 2 "parallel[.]expert_replicas=.*expert 0's first holder is ep rank 1, not its owner 0"
  --set parallel.dp=2 --set parallel.ep=2 --set parallel.expert_slots=3
  --set "parallel.expert_replicas=0:1=1")
adgt_moe_error(replicas_slots 2 "parallel[.]expert_slots=1 is less than the 2 experts each ep rank owns"
  --set parallel.dp=2 --set parallel.ep=2 --set parallel.expert_slots=1)
adgt_moe_error(ep_experts 4 "parallel[.]ep=4 does not divide model[.]n_experts=6"
  --set model.n_experts=6 --set parallel.dp=4 --set parallel.ep=4 --set train.global_batch=8)
adgt_moe_error(ep_dp 3 "parallel[.]ep=2 does not divide parallel[.]dp=3"
  --set parallel.dp=3 --set parallel.ep=2 --set train.global_batch=6)
adgt_moe_error(top_k 2 "model[.]moe_top_k=5 is larger than model[.]n_experts=4"
  --set model.moe_top_k=5 --set parallel.dp=2 --set train.global_batch=8)

# Capacity-weighted expert placement with replicas on the MoE layer
# (tests/tools/bench_expert_placement.cpp; the benchmark is 8 ranks, 64
# experts, docs/adaptation.md): a small version, 4 ranks, 16 experts, rank 2
# at half speed, 5 slots, nominal capacities: imbalance (rows / capacity)
# <= 0.15, rank 2's rows 0.5x +-10%, the layer's numbers within 1e-5.
add_executable(adgt_bench_expert_placement ${CMAKE_CURRENT_SOURCE_DIR}/tools/bench_expert_placement.cpp)
target_link_libraries(adgt_bench_expert_placement PRIVATE adgt_parallel)
add_test(NAME moe_expert_replicas_np4
  COMMAND timeout 150 ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 4
          $<TARGET_FILE:adgt_bench_expert_placement> --experts 16 --slots 5 --slow 2 --factor 2
          --tokens 256 --iters 2 --nominal --check)
set_tests_properties(moe_expert_replicas_np4 PROPERTIES LABELS "parallel;moe;adapt" TIMEOUT 180 PROCESSORS 2)
