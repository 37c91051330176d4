# Small versions of the fuzz and corruption campaigns of docs/reliability.md
# ("Fuzzing and corruption campaigns"; the full ones are the scripts with their
# defaults). Each fails on any crash, hang, rejection that names neither the
# key nor a line, silently accepted invalid input, damaged checkpoint refused
# without naming the file (and tensor), or damaged checkpoint that loads
# differently.
if(NOT TARGET adgt-train)
  return()
endif()

# 60 fuzzed run files from configs/*.yaml (seed 12: its case 22, model.d_model =
# 2^63 - 1, once hung) through adgt-train --print-config.
add_test(NAME reliability_config_fuzz
  COMMAND ${ADGT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/reliability/fuzz_configs.py
    --bin $<TARGET_FILE:adgt-train> -n 60 --seed 12 --jobs 1 --timeout 20
    --out ${CMAKE_BINARY_DIR}/reliability_config_fuzz)
set_tests_properties(reliability_config_fuzz PROPERTIES LABELS "config;reliability" TIMEOUT 120)

# 12 bit-flip / truncation trials (seed 5) of a 2-rank tp=2 checkpoint, each
# resumed for one step on 2 ranks.
add_test(NAME reliability_checkpoint_corruption
  COMMAND ${ADGT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/reliability/corrupt_checkpoints.py
    --train $<TARGET_FILE:adgt-train> --data ${CMAKE_BINARY_DIR}/data/kjv-byte
    --trials 12 --seed 5 --timeout 60 --work ${CMAKE_BINARY_DIR}/reliability_checkpoint_corruption)
set_tests_properties(reliability_checkpoint_corruption PROPERTIES FIXTURES_REQUIRED kjv_byte
  LABELS "checkpoint;parallel;reliability" TIMEOUT 240 PROCESSORS 2)
