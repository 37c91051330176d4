# The quick tier: `ctest -L quick` (scripts/test.sh --quick), about two
# minutes on 2 cores after the build, for everyday work. The full suite
# (scripts/test.sh, CI) runs everything. What is here: the Catch2 unit cases
# not tagged [slow] (labelled by their registration in tests/CMakeLists.txt),
# the layering check, the kernel emulation of every CUDA kernel family (not
# the mutants), configuration and CLI errors, the PyTorch and HuggingFace
# references, the damaged-input fuzz set (40 cases, a few seconds), the
# single-process end-to-end runs except the long ones, and a
# handful of 2-4-rank layouts. Fixtures (the prepared corpora) run first by
# themselves. A name no module registered (a module that returns early when
# its target is not built) is left out with a warning.
set(ADGT_QUICK_TESTS
  layering_rooms layering_rooms_self_test
  kernel_sim_rmsnorm kernel_sim_attention kernel_sim_attention_long kernel_sim_pointwise
  kernel_sim_classifier kernel_sim_optimizer kernel_sim_embedding kernel_sim_combine
  kernel_sim_moe_routing
  config_error_unknown_key config_error_tp3 config_error_bad_set config_error_yaml_syntax
  config_error_pp_fewer_microbatches dry_run_llama_70b plan_dry_run_70b_256_h100
  schedule_bubble_table schedule_print_zb_h1 pipeline_print_schedule_zb_v
  sim_cli_json sim_cli_bad_cluster sim_dry_run_prediction
  hf_unit hf_roundtrip hf_torch torch_reference_f32 torch_reference_f64 moe_torch_f32
  checkpoint_h5py data_fuzz_inputs
  e2e_signal e2e_eval e2e_nan e2e_resume
  parallel_collectives_np2 parallel_collectives_np4 parallel_mesh_check_tp2_dp2
  parallel_one_rank_fails layouts_error_world_size layouts_session_dir_per_launch
  compress_reduce_np4 compress_train_int8 compress_train_tp2_dp2 compress_train_pp2_dp2
  moe_ep_np2 dp_overlap_bitwise_1f1b emulate_train_same_losses_tp2_pp2
  checkpoint_async_identical_pp2 trace_timeline_pp4_dp2 power_cap_emulated_np2 telemetry_train
  parallel_site_comm_np4 sites_hierarchical_matches_flat_f32)
foreach(t ${ADGT_QUICK_TESTS})
  if(TEST ${t})
    set_property(TEST ${t} APPEND PROPERTY LABELS quick)
  else()
    message(WARNING "tests/tiers/quick.cmake: no test ${t} in this build; the quick tier runs without it")
  endif()
endforeach()
