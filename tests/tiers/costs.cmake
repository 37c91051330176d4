# Test costs for ctest's scheduling (docs/testing.md): with -j2 ctest starts
# the costliest tests first, which on a fresh clone (no Testing/Temporary/
# CTestCostData.txt yet) it only knows from here. Seconds each test took
# in a full run on the 2-core VM (2026-12-07 03:37, the build directory, idle;
# tests of 4 s or more); a stale figure only changes the order, never a verdict.
# The longest parallel tests start first and the rest pack around them;
# ctest starts a RUN_SERIAL test only when nothing else runs, whatever its
# cost (a +10000 on theirs, tried, did not move them: they still ran after
# the parallel ones).
set(_adgt_costs
  e2e_loss 56
  layouts_match_single_process_emulated 44
  fp8_train_converges_resumes 34
  checkpoint_expert_np4 30
  pipeline_match_single_process_dp2 30
  pipeline_match_single_process_none 29
  pipeline_match_single_process_tp2 29
  moe_layouts_match_single_process_emulated 29
  layouts_match_single_process 28
  adapt_schedule_slow_rank_memory_pp4 28
  pipeline_match_single_process_none_emulated 26
  cuda_check_bundle_rehearsal 25
  sim_validate_cpu_quick 24
  recompute_bitwise_emulated 22
  zero_match_zero0 22
  checkpoint_pipeline_np4 22
  checkpoint_async_sigkill 20
  reliability_checkpoint_corruption 19
  elastic_grow_np4 19
  pipeline_match_single_process_rendezvous 17
  data_foreign_train 17
  elastic_kill_np4 16
  slurm_sbatch_template_elastic 15
  fp8_layouts_match_single_process 14
  sites_bench_model_clock 14
  slurm_sbatch_template_requeue 14
  adapt_experts_train_np8 13
  plan_replan_straggler_np8 12
  moe_layouts_match_single_process 11
  layouts_bf16_match_single_process_emulated 11
  fp8_layouts_match_single_process_emulated 11
  zero_match_zero0_emulated 11
  newuser_plan_70b_matches_sim 11
  power_cap_emulated_np2 11
  layouts_cp_match_single_process 10
  plan_dry_run_70b_256_h100 10
  plan_replan_slow_link_np8 10
  recompute_bitwise 9
  layouts_cp_match_single_process_emulated 8
  flash_attention_emulated 8
  data_foreign_read 8
  torch_compare_selftest 8
  newuser_walkthrough 8
  switch_in_memory_fp8_np8 8
  sim_published_runs 7
  plan_auto_launch_np8 7
  switch_in_memory_cp_np8 7
  adapt_expert_replicas_np4 7
  plan_auto_resume_np8 7
  data_blend_val 7
  switch_in_memory_zero23_np8 7
  watchdog_stop_np4 7
  watchdog_stall_np4 6
  sites_hierarchical_matches_flat_f64 6
  layouts_bf16_match_single_process 6
  slurm_srun_collectives 6
  switch_in_memory_dense_messages_np8 6
  switch_in_memory_dense_fallback_np8 6
  switch_in_memory_zero_np8 6
  checkpoint_sigkill_during_save 5
  sites_hierarchical_matches_flat_f32 5
  sites_compress_wan_only_int4 5
  e2e_bf16 5
  switch_in_memory_dense_window_np8 5
  adapt_expert_placement_slow_rank_np4 5
  layouts_srun_matches_mpirun 5
  switch_in_memory_moe_np8 5
  switch_in_memory_dense_np8 5
  tei_interrupted_job 4
)
list(LENGTH _adgt_costs _n)
math(EXPR _last "${_n} - 1")
foreach(_i RANGE 0 ${_last} 2)
  math(EXPR _j "${_i} + 1")
  list(GET _adgt_costs ${_i} _name)
  list(GET _adgt_costs ${_j} _cost)
  if(TEST ${_name})
    set_tests_properties(${_name} PROPERTIES COST ${_cost})
  endif()
endforeach()
