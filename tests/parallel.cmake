# The parallel layer (docs/parallel.md): launch detection, mesh and device
# unit tests (compiled into adgt_unit_tests), MpiComm and the process groups
# under mpirun at 1, 2, 3, 4 and 8 ranks, bad launches, NcclComm (skipped
# without GPUs), and srun inside a private Slurm cluster.
if(NOT TARGET adgt_parallel)
  return()
endif()
target_link_libraries(adgt_unit_tests PRIVATE adgt_parallel)

set(ADGT_PAR ${CMAKE_CURRENT_SOURCE_DIR}/parallel)
set(ADGT_MPIRUN ${ADGT_PAR}/mpirun.sh)

add_executable(adgt_parallel_collectives_test ${ADGT_PAR}/collectives_test.cpp)
target_link_libraries(adgt_parallel_collectives_test PRIVATE adgt_parallel)
add_executable(adgt-mesh-check ${ADGT_PAR}/mesh_check.cpp)
target_link_libraries(adgt-mesh-check PRIVATE adgt_parallel)

foreach(n 1 2 3 4 8)
  add_test(NAME parallel_collectives_np${n}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^collectives: ok on ${n} ranks" --
            timeout 120 ${ADGT_MPIRUN} ${n} $<TARGET_FILE:adgt_parallel_collectives_test>)
  set_tests_properties(parallel_collectives_np${n} PROPERTIES LABELS parallel TIMEOUT 150 PROCESSORS 2)
endforeach()

# Ring attention (parallel/cp/) on 2, 3 and 4 ranks: each rank's chunks of out,
# dq, dk, dv against the single-process attention on the whole sequence, f64
# and f32.
add_executable(adgt_parallel_ring_attention_test ${ADGT_PAR}/ring_attention_test.cpp)
target_link_libraries(adgt_parallel_ring_attention_test PRIVATE adgt_parallel)
foreach(n 2 3 4)
  add_test(NAME parallel_ring_attention_cp${n}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^ring attention: ok on ${n} ranks" --
            timeout 90 ${ADGT_MPIRUN} ${n} $<TARGET_FILE:adgt_parallel_ring_attention_test>)
  set_tests_properties(parallel_ring_attention_cp${n} PROPERTIES LABELS parallel TIMEOUT 120 PROCESSORS 2)
endforeach()

add_test(NAME parallel_mesh_check_tp2_dp2
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^mesh-check: ok [(]4 ranks, launcher mpirun[)]" --
          timeout 60 ${ADGT_MPIRUN} 4 $<TARGET_FILE:adgt-mesh-check> --tp 2 --dp 2)

# Bad launches end on every rank, non-zero, within seconds, with the named error.
add_test(NAME parallel_bad_world_size
  COMMAND ${ADGT_PAR}/expect_all_ranks.sh 8
          "parallel: tp=2 x dp=2 x pp=1 = 4 ranks but the launch has 8 [(]mpirun -np / srun -n[)]; use -np 4 / -n 4, or parallel[.]dp=4 for 8 ranks" --
          ${ADGT_MPIRUN} 8 $<TARGET_FILE:adgt-mesh-check> --tp 2 --dp 2)
add_test(NAME parallel_bad_shared_device
  COMMAND ${CMAKE_COMMAND} -E env ADGT_FAKE_DEVICES=0,0
          ${ADGT_PAR}/expect_all_ranks.sh 2
          "device assignment: ranks 0 and 1 both use device gpu0 on host [^;]+; give each rank its own GPU" --
          ${ADGT_MPIRUN} 2 $<TARGET_FILE:adgt-mesh-check> --dp 2)
add_test(NAME parallel_shared_device_test_mode
  COMMAND ${CMAKE_COMMAND} -E env ADGT_FAKE_DEVICES=0,0 ADGT_SHARED_GPU_TEST=1
          ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^mesh-check: ok" --
          timeout 60 ${ADGT_MPIRUN} 2 $<TARGET_FILE:adgt-mesh-check> --dp 2)
add_test(NAME parallel_distinct_devices
  COMMAND ${CMAKE_COMMAND} -E env ADGT_FAKE_DEVICES=0,1
          ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "gpu1" --
          timeout 60 ${ADGT_MPIRUN} 2 $<TARGET_FILE:adgt-mesh-check> --dp 2)
# One rank fails alone while the others wait in a barrier: the job must still end.
add_test(NAME parallel_one_rank_fails
  COMMAND ${CMAKE_COMMAND} -E env ADGT_MESH_CHECK_FAIL_RANK=2
          ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh
          "^error: rank 2 [(]host [^)]+[)]: mesh-check: injected failure on rank 2" --
          timeout 60 ${ADGT_MPIRUN} 4 $<TARGET_FILE:adgt-mesh-check> --tp 2 --dp 2)
add_test(NAME parallel_unknown_launcher
  COMMAND ${CMAKE_COMMAND} -E env RANK=0 WORLD_SIZE=2
          ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --status 1
          "^error: rank [?] [(]host .*[)]: launch: unknown launcher: .*RANK=0 WORLD_SIZE=2.*launch with `mpirun -np N [.][.][.]` [(]Open MPI[)] or `srun --mpi=pmix -n N [.][.][.]`" --
          timeout 60 $<TARGET_FILE:adgt-mesh-check> --dp 2)
set_tests_properties(parallel_mesh_check_tp2_dp2 parallel_bad_world_size parallel_bad_shared_device
  parallel_shared_device_test_mode parallel_distinct_devices parallel_one_rank_fails
  parallel_unknown_launcher
  PROPERTIES LABELS parallel TIMEOUT 90 PROCESSORS 2)

# NcclComm: compiled and linked whenever CUDA and NCCL are; run under mpirun
# with one GPU per rank, reported as skipped (exit 77) on a machine without GPUs.
if(ADGT_HAVE_NCCL)
  add_executable(adgt_parallel_nccl_test ${ADGT_PAR}/nccl_test.cpp)
  target_link_libraries(adgt_parallel_nccl_test PRIVATE adgt_parallel)
  add_test(NAME parallel_nccl_np1
    COMMAND timeout 120 ${ADGT_MPIRUN} 1 $<TARGET_FILE:adgt_parallel_nccl_test>)
  set_tests_properties(parallel_nccl_np1 PROPERTIES LABELS "parallel;gpu" TIMEOUT 150 SKIP_RETURN_CODE 77)
endif()

# srun: a private one-node Slurm cluster (tests/slurm/with_slurm.sh, needs root
# and Debian's slurmctld slurmd slurm-client munge) runs the collectives test
# and the mesh check as Open MPI ranks through `srun --mpi=pmix`, and checks
# that a launch without PMIx is refused. Fails (does not skip) when the
# cluster cannot start.
add_test(NAME slurm_srun_collectives
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm/with_slurm.sh --
          ${CMAKE_CURRENT_SOURCE_DIR}/slurm/srun_checks.sh
          $<TARGET_FILE:adgt_parallel_collectives_test> $<TARGET_FILE:adgt-mesh-check>)
set_tests_properties(slurm_srun_collectives PROPERTIES LABELS "parallel;slurm" TIMEOUT 240 RUN_SERIAL TRUE)

# scripts/slurm/adgt-train.sbatch, submitted to the private cluster with fake
# GPUs and a stand-in trainer: the time-limit signal reaches every rank, the
# job requeues itself once and the second run resumes with --resume auto.
add_test(NAME slurm_sbatch_template_requeue
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm/with_slurm.sh --fake-gpus 4 --
          ${CMAKE_CURRENT_SOURCE_DIR}/slurm/sbatch_requeue_check.sh
          ${CMAKE_SOURCE_DIR}/scripts/slurm/adgt-train.sbatch
          ${CMAKE_CURRENT_SOURCE_DIR}/slurm/fake_train.sh)
set_tests_properties(slurm_sbatch_template_requeue PROPERTIES LABELS "parallel;slurm" TIMEOUT 120 RUN_SERIAL TRUE)
# The same with ELASTIC=1: the trainer runs under scripts/adgt-elastic, which
# starts srun itself and forwards the time-limit signal.
add_test(NAME slurm_sbatch_template_elastic
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/slurm/with_slurm.sh --fake-gpus 4 --
          ${CMAKE_CURRENT_SOURCE_DIR}/slurm/sbatch_requeue_check.sh
          ${CMAKE_SOURCE_DIR}/scripts/slurm/adgt-train.sbatch
          ${CMAKE_CURRENT_SOURCE_DIR}/slurm/fake_train.sh elastic)
set_tests_properties(slurm_sbatch_template_elastic PROPERTIES LABELS "parallel;slurm" TIMEOUT 120 RUN_SERIAL TRUE)
