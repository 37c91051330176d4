# End-to-end config checks through the real binary: each bad case must make
# `adgt-train --dry-run` print "error: <message>" on stderr and exit 2 (the
# ConfigError contract of apps/adgt_train.cpp). The regexes pin the specific
# message; [.] and [?] stand for literal characters to keep CMake escaping out.
# The same cases are covered without the binary in tests/unit/config_test.cpp.
if(NOT TARGET adgt-train)
  message(STATUS "tests/bad_config.cmake: no adgt-train target yet; config CLI tests skipped")
  return()
endif()

set(ADGT_EXPECT ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh)
set(ADGT_BAD_CONFIGS ${CMAKE_CURRENT_SOURCE_DIR}/bad_configs)

# adgt_config_error(<case> <stderr regex> [extra adgt-train args...]):
# runs adgt-train --config bad_configs/<case>.yaml --dry-run <extra>.
function(adgt_config_error case regex)
  add_test(NAME config_error_${case}
    COMMAND bash ${ADGT_EXPECT} --status 2 "${regex}" --
      $<TARGET_FILE:adgt-train> --config ${ADGT_BAD_CONFIGS}/${case}.yaml --dry-run ${ARGN})
  set_tests_properties(config_error_${case} PROPERTIES LABELS config TIMEOUT 30)
endfunction()

adgt_config_error(unknown_key
  "^error: .*unknown_key[.]yaml:4: model[.]n_layerz: unknown key; did you mean model[.]n_layers[?]")
adgt_config_error(wrong_type
  "^error: .*wrong_type[.]yaml:4: train[.]micro_batch: expected a positive integer, got \"eight\"")
adgt_config_error(negative_value
  "^error: .*negative_value[.]yaml:3: train[.]micro_batch: expected a positive integer, got -3")
adgt_config_error(bad_bool
  "^error: .*bad_bool[.]yaml:3: model[.]tie_embeddings: expected true or false, got \"yes\"")
adgt_config_error(lr_zero
  "^error: .*lr_zero[.]yaml:3: train[.]lr: expected a number > 0, got 0")
adgt_config_error(heads_not_divisible
  "^error: .*heads_not_divisible[.]yaml: model[.]n_heads=12 is not divisible by model[.]n_kv_heads=8; choose n_kv_heads in [{]1,2,3,4,6,12[}]")
adgt_config_error(batch_not_divisible
  "^error: .*batch_not_divisible[.]yaml: train[.]global_batch=10 is not a multiple of train[.]micro_batch=4 x parallel[.]dp=1; use 8 or 12")
adgt_config_error(unknown_section
  "^error: .*unknown_section[.]yaml:4: unknown section \"optimiser\"; did you mean train")
adgt_config_error(yaml_syntax
  "^error: .*yaml_syntax[.]yaml:4: YAML syntax error")
adgt_config_error(tp3
  "^error: .*tp3[.]yaml: parallel[.]tp=3 does not divide model[.]n_heads=8; use tp in [{]1,2,4[}]")
# Pipeline settings (the cross-field rules of layout_errors in core/layout.cpp).
adgt_config_error(pp_fewer_microbatches
  "^error: .*pp_fewer_microbatches[.]yaml: parallel[.]schedule=1f1b with parallel[.]pp=4: fewer micro-batches than stages [(]train[.]global_batch=4 / [(]train[.]micro_batch=2 x parallel[.]dp=1[)] = 2, need >= 4[)]; use train[.]global_batch >= 8, or parallel[.]schedule=gpipe")
adgt_config_error(pp_interleaved_layers
  "^error: .*pp_interleaved_layers[.]yaml: model[.]n_layers=12 is not divisible by parallel[.]pp x parallel[.]virtual_stages = 2 x 4 = 8 stages: .*use virtual_stages in [{]2,3,6[}]")
adgt_config_error(pp_stage_layers_entry
  "^error: .*pp_stage_layers_entry[.]yaml:11: parallel[.]stage_layers: expected a list of positive integers, got \"two\" at entry 2")
adgt_config_error(blend_weight
  "^error: .*blend_weight[.]yaml:7: data[.]val[[]1[]][.]weight: expected a number > 0, got -1")
# The same rule in a real launch: reported once (rank 0) and the job ends
# (mpirun's status is a rank's: 2). pp=2 on 2 ranks, 2 / (2 x 1) = 1 micro-batch.
add_test(NAME config_error_pp_fewer_microbatches_np2
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/parallel/expect_all_ranks.sh --once 2
    ".*pp_fewer_microbatches[.]yaml, --set parallel[.]pp=2, --set train[.]global_batch=2: parallel[.]schedule=1f1b with parallel[.]pp=2: fewer micro-batches than stages" --
    ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 2 $<TARGET_FILE:adgt-train>
      --config ${ADGT_BAD_CONFIGS}/pp_fewer_microbatches.yaml
      --set parallel.pp=2 --set train.global_batch=2)
add_test(NAME config_error_pp_fewer_microbatches_np2_status
  COMMAND bash ${ADGT_EXPECT} --status 2
    "^error: rank 0 [(]host [^)]+[)]: .*pp_fewer_microbatches[.]yaml, --set parallel[.]pp=2, --set train[.]global_batch=2: .*parallel[.]pp=2: fewer micro-batches than stages" --
    ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh 2 $<TARGET_FILE:adgt-train>
      --config ${ADGT_BAD_CONFIGS}/pp_fewer_microbatches.yaml
      --set parallel.pp=2 --set train.global_batch=2)
set_tests_properties(config_error_pp_fewer_microbatches_np2
  config_error_pp_fewer_microbatches_np2_status
  PROPERTIES LABELS "config;parallel" TIMEOUT 90 PROCESSORS 2)
# A missing file (no such case file exists on purpose).
adgt_config_error(does_not_exist
  "^error: .*does_not_exist[.]yaml: cannot open config file")
# A bad override on an otherwise valid config.
add_test(NAME config_error_bad_set
  COMMAND bash ${ADGT_EXPECT} --status 2
    "^error: --set train[.]steps=abc: train[.]steps: expected a positive integer, got \"abc\"" --
    $<TARGET_FILE:adgt-train> --config ${CMAKE_SOURCE_DIR}/configs/tiny.yaml
      --set train.steps=abc --dry-run)
set_tests_properties(config_error_bad_set PROPERTIES LABELS config TIMEOUT 30)

# The positive case: the largest shipped config is estimated without allocating it.
add_test(NAME dry_run_llama_70b
  COMMAND bash ${ADGT_EXPECT} --success "68,976,648,192" --
    $<TARGET_FILE:adgt-train> --config ${CMAKE_SOURCE_DIR}/configs/llama-70b.yaml --dry-run)
set_tests_properties(dry_run_llama_70b PROPERTIES LABELS config TIMEOUT 30)
