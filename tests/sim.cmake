# The cluster model and the step simulator (docs/cluster.md,
# docs/simulator.md): unit tests (tests/unit/cluster_model_test.cpp and
# sim_step_test.cpp, tags [cluster] and [sim]) compiled into adgt_unit_tests.
if(NOT TARGET adgt_sim)
  return()
endif()
target_link_libraries(adgt_unit_tests PRIVATE adgt_sim)

if(NOT TARGET adgt-sim)
  return()
endif()
set(_sim $<TARGET_FILE:adgt-sim>)
set(_expect ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh)
# The CLI: a run file simulated on a preset prints the JSON keys the planner
# reads; a bad cluster file is a named error (file:line, key), exit 2; a
# sweep ranks layouts.
add_test(NAME sim_cli_json
  COMMAND bash ${_expect} --success
    "\"bubble\":.*\"exposed_comm_s\":.*\"memory_gib_max\":.*\"mfu\":.*\"step_time_s\":.*\"tflops_per_gpu\":.*\"tokens_per_s\":"
    -- ${_sim} --config ${CMAKE_SOURCE_DIR}/configs/llama-7b.yaml --cluster dgx-h100
       --set train.dtype=bf16 --set parallel.tp=8 --set parallel.pp=2 --set parallel.dp=4 --json)
add_test(NAME sim_cli_bad_cluster
  COMMAND bash ${_expect} --status 2 "bad_cluster.yaml:7: inter.bandwidth_gbps: unknown key; allowed: bandwidth_GBps, latency_us, efficiency"
    -- ${_sim} --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml --cluster ${CMAKE_CURRENT_SOURCE_DIR}/sim/bad_cluster.yaml)
# --print-cluster: a preset as a cluster file, every field (the H100's fitted clock).
add_test(NAME sim_cli_print_cluster
  COMMAND bash ${_expect} --success "^  sustained_clock: 0[.]9$"
    -- ${_sim} --print-cluster --cluster dgx-h100)
add_test(NAME sim_cli_sweep
  COMMAND bash ${_expect} --success "^1 +tp=.* pp=.* dp=" --
    ${_sim} --config ${CMAKE_SOURCE_DIR}/configs/llama-13b.yaml --cluster dgx-h100 --gpus 32 --sweep
    --set train.dtype=bf16 --top 3)
add_test(NAME sim_dry_run_prediction
  COMMAND bash ${_expect} --success "^predicted step: .* on dgx-a100-80gb .*MFU" --
    $<TARGET_FILE:adgt-train> --config ${CMAKE_SOURCE_DIR}/configs/llama-70b.yaml --dry-run
    --set parallel.tp=8 --set parallel.pp=8 --set parallel.dp=4 --set train.dtype=bf16
    --cluster dgx-a100-80gb)
set_tests_properties(sim_cli_json sim_cli_bad_cluster sim_cli_sweep sim_dry_run_prediction
  PROPERTIES LABELS sim TIMEOUT 120)

# Against published runs (docs/scale.md): the runs other than the calibration
# sets (Megatron-LM 2021 Table 1 for the A100 clock, MosaicML's other H100
# rows for the factor of its 2023 software, scripts/sim/published.py STACKS)
# within a mean |error| of 10% (the device model only: fast): 26 runs, 7.2%
# on 2026-12-07. --check-stacks refits that factor and fails when the stored
# one is off by more than 0.01 (a change to the simulator that moves it must
# restate it, with docs/scale.md).
add_test(NAME sim_published_runs
  COMMAND ${ADGT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/sim/published.py --sim ${_sim} --bound 0.10
    --check-stacks)
set_tests_properties(sim_published_runs PROPERTIES LABELS sim TIMEOUT 300)

# Against measured runs on 8 CPU ranks with an emulated 2-node cluster timed on
# the emulation's model clock (scripts/sim/validate_cpu.py --quick --clock
# model, docs/simulator.md): the runs' compute and the simulator's op profile
# both count matmul FLOPs at emulate.model_flops, so the comparison is the
# simulator's against the emulation, the same under any load: four layouts'
# step times (dp, dp with one micro-batch, 1f1b and interleaved pipelines)
# each within 15%, their mean within 10%; three layouts' memory within 5%.
# The issue's 10% over 14 layouts on this host's measured times is the full
# script's (virtual clock), a benchmark (scripts/bench.sh).
if(TARGET adgt-train)
  add_test(NAME sim_validate_cpu_quick
    COMMAND ${ADGT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/sim/validate_cpu.py --quick --clock model
      --train $<TARGET_FILE:adgt-train> --sim ${_sim}
      --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh --data ${CMAKE_BINARY_DIR}/data/kjv-byte
      --work ${CMAKE_BINARY_DIR}/sim_validate)
  set_tests_properties(sim_validate_cpu_quick PROPERTIES
    FIXTURES_REQUIRED kjv_byte LABELS "sim;parallel" TIMEOUT 300 PROCESSORS 2)
endif()
