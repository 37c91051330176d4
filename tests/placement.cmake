# Rank placement (docs/placement.md): 8 CPU ranks as the 2 nodes x 4 of
# configs/clusters/emulated-2node.yaml, tp=4 dp=2, the emulated launcher
# handing ranks out round-robin (mpirun --map-by node). parallel.placement=
# topology puts every tp group on one node, as block order does; launcher
# keeps the order, so each tp group spans both nodes; the losses of all are
# the same bit for bit (tests/placement/compare_placement.py). Unit tests of
# the pure placement: tests/unit/placement_test.cpp. The step-time effect:
# scripts/plan/placement_bench.sh.
if(NOT TARGET adgt-train OR NOT TARGET adgt-data OR NOT TARGET adgt_parallel)
  return()
endif()
set(ADGT_PLACEMENT_ARGS ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/placement/compare_placement.py
  --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
  --data ${CMAKE_BINARY_DIR}/data/kjv-byte --model ${CMAKE_CURRENT_SOURCE_DIR}/emulate/model.yaml
  --cluster ${CMAKE_SOURCE_DIR}/configs/clusters/emulated-2node.yaml
  --set model.n_layers=2 --set train.steps=3)
# Block order and round-robin under topology placement: the same tp groups, the same losses.
add_test(NAME placement_topology_round_robin_tp4_dp2
  COMMAND ${ADGT_PLACEMENT_ARGS} --work ${CMAKE_BINARY_DIR}/placement/topology
    --only block --only topology)
# Round-robin under launcher placement: tp groups across nodes, the same losses.
add_test(NAME placement_launcher_round_robin_tp4_dp2
  COMMAND ${ADGT_PLACEMENT_ARGS} --work ${CMAKE_BINARY_DIR}/placement/launcher
    --only topology --only launcher)
set_tests_properties(placement_topology_round_robin_tp4_dp2 placement_launcher_round_robin_tp4_dp2
  PROPERTIES FIXTURES_REQUIRED kjv_byte LABELS "parallel;emulate" TIMEOUT 120 PROCESSORS 2)
