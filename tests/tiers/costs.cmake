# Test costs for ctest's scheduling (docs/testing.md): with -j2 ctest starts
# the costliest tests first, which on a fresh clone (no Testing/Temporary/
# CTestCostData.txt yet) it only knows from here. Seconds each test took
# alone-ish in a full run on the 2-core VM (2026-12-06, a fresh clone; tests
# of 4 s or more; the kernel emulation's from 2026-12-06 08:05, after its
# fibers moved to Boost.Context: 2 s or less each); a stale figure only changes
# the order, never a verdict.
# The longest parallel tests start first and the rest pack around them;
# ctest starts a RUN_SERIAL test only when nothing else runs, whatever its
# cost (a +10000 on theirs, tried, did not move them: they still ran after
# the parallel ones).
set(_adgt_costs
  e2e_loss 82
  pipeline_match_single_process_none_emulated 78
  pipeline_match_single_process_none 69
  e2e_bf16 53
  layouts_match_single_process_emulated 49
  zero_match_zero0 40
  zero_match_zero0_emulated 15
  zero_match_zero0_f64 10
  zero_memory_estimate_emulated 7
  pipeline_match_single_process_tp2 40
  pipeline_match_single_process_dp2 40
  pipeline_match_single_process_rendezvous 40
  layouts_match_single_process 39
  elastic_grow_np4 25
  sim_validate_cpu_quick 25
  recompute_bitwise_emulated 25
  moe_layouts_match_single_process_emulated 22
  adapt_schedule_slow_rank_memory_pp4 22
  elastic_kill_np4 22
  checkpoint_async_sigkill 21
  cuda_check_bundle_rehearsal 21
  bf16 19
  plan_auto_resume_np8 19
  moe_layouts_match_single_process 19
  reliability_checkpoint_corruption 19
  recompute_bitwise 17
  newuser_walkthrough 16
  adapt_experts_train_np8 15
  checkpoint_expert_np4 14
  slurm_sbatch_template_elastic 14
  plan_replan_straggler_np8 14
  slurm_sbatch_template_requeue 14
  plan_auto_launch_np8 13
  flash_attention_emulated 6
  layouts_bf16_match_single_process_emulated 12
  data_foreign_train 11
  adapt_expert_replicas_np4 10
  checkpoint_pipeline_np4 10
  switch_in_memory_zero_np8 10
  switch_in_memory_zero23_np8 10
  switch_in_memory_cp_np8 10
  plan_auto_constraint_np8 10
  switch_in_memory_dense_np8 9
  checkpoint_damaged_all_ranks 9
  plan_replan_slow_link_np8 9
  layouts_bf16_match_single_process 9
  e2e_resume 9
  switch_in_memory_dense_messages_np8 8
  data_blend_val 8
  switch_in_memory_moe_np8 8
  switch_in_memory_dense_fallback_np8 8
  plan_auto_infeasible_np8 7
  adapt_schedule_slow_link_messages_pp4 7
  switch_in_memory_dense_window_np8 7
  watchdog_stop_np4 7
  adapt_schedule_slow_rank_onset_pp4 7
  checkpoint_sigkill_during_save 7
  slurm_srun_collectives 6
  adapt_expert_placement_slow_rank_np4 6
  watchdog_stall_np4 6
  layouts_srun_matches_mpirun 6
  reliability_config_fuzz 5
  attention 5
  fused 5
  adapt_schedule_slow_link_pp4 5
  bf16 4
  layouts_document_mask_emulated 4
  sim_published_runs 4
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
