# HuggingFace export and import (adgt-ckpt export-hf / import-hf / info;
# docs/huggingface.md). adgt_hf_fixture writes a checkpoint of tests/hf/model.yaml
# with known weights; tests/hf/hf_check.py exports it, reads the safetensors with
# its own reader (tests/hf/safetensors_reader.py, no safetensors package),
# compares tests/torch/llama_ref.py's logits on those weights with adgt's
# (adgt-reference-dump --checkpoint), checks sharding, bfloat16 rounding, the
# import round trip, named errors on damaged files, and a run started from an
# import; the moe_* checks do the same for a mixture-of-experts model
# (tests/hf/moe.yaml) exported as MixtralForCausalLM, against
# tests/hf/mixtral_ref.py. adgt_hf_unit_tests covers the C++ pieces without Python.
if(NOT TARGET adgt-ckpt)
  message(STATUS "tests/hf.cmake: no adgt-ckpt target; HuggingFace tests skipped")
  return()
endif()

add_executable(adgt_hf_fixture ${CMAKE_CURRENT_SOURCE_DIR}/hf/make_checkpoint.cpp)
target_link_libraries(adgt_hf_fixture PRIVATE adgt_core)
add_executable(adgt_hf_unit_tests ${CMAKE_CURRENT_SOURCE_DIR}/hf/hf_unit_test.cpp)
target_link_libraries(adgt_hf_unit_tests PRIVATE adgt_core Catch2::Catch2)
add_test(NAME hf_unit COMMAND adgt_hf_unit_tests)
set_tests_properties(hf_unit PROPERTIES LABELS hf TIMEOUT 60)

set(_hf_tools
  --ckpt-tool $<TARGET_FILE:adgt-ckpt> --fixture $<TARGET_FILE:adgt_hf_fixture>
  --dump-tool $<TARGET_FILE:adgt-reference-dump>
  --config ${CMAKE_CURRENT_SOURCE_DIR}/hf/model.yaml
  --moe-config ${CMAKE_CURRENT_SOURCE_DIR}/hf/moe.yaml)
if(TARGET adgt-train AND TARGET adgt-data)
  list(APPEND _hf_tools --train-tool $<TARGET_FILE:adgt-train> --data-tool $<TARGET_FILE:adgt-data>
       --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh)
endif()
foreach(check roundtrip torch torch_tied shards bf16 errors train moe_roundtrip moe_torch moe_train moe_errors)
  add_test(NAME hf_${check}
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/hf/hf_check.py ${check} ${_hf_tools}
      --work ${CMAKE_CURRENT_BINARY_DIR}/hf/${check})
  set_tests_properties(hf_${check} PROPERTIES LABELS hf TIMEOUT 120 ENVIRONMENT OMP_NUM_THREADS=2)
endforeach()
