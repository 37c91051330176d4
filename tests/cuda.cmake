# The CUDA backend (docs/cuda.md). Its CUDA-vs-CPU tests are Catch2 cases
# (tests/unit/cuda_backend_test.cpp, tag [cuda]) in adgt_unit_tests, each
# registered by catch_discover_tests; without a GPU they check the no-GPU
# behaviour (make_backend("cuda") errors, "auto" is the CPU) and skip the rest.
# Here: the one-call GPU check script parses and finds every file it uses;
# with the CUDA build, its bundle is made and rehearsed (below). Its run mode
# needs a GPU.
# The PyTorch baseline the GPU check compares adgt with
# (scripts/device/torch_llama_bench.py): its --smoke mode runs a tiny model on
# the CPU in fp32 and checks it (loss at init ~ log(vocab), the logits of
# tests/torch/llama_ref.py, causality, overfitting one batch). Exit 77 (no
# torch in ${ADGT_PYTHON}) is a skip.
add_test(NAME torch_llama_bench_smoke
  COMMAND ${CMAKE_COMMAND} -E env OMP_NUM_THREADS=1 PYTHONDONTWRITEBYTECODE=1
    ${ADGT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/device/torch_llama_bench.py --smoke
    --json ${CMAKE_CURRENT_BINARY_DIR}/torch_llama_bench_smoke.json)
set_tests_properties(torch_llama_bench_smoke PROPERTIES
  LABELS "cuda;torch" TIMEOUT 120 SKIP_RETURN_CODE 77)

# The flash attention kernels (kernels/cuda/flash_attention_kernels.cuh) run
# in a host emulation of CUDA (tests/tools/cuda_sim/) against a double
# reference (whose document masking is checked against the CPU backend's): a
# plain C++ build that needs neither nvcc nor a GPU, so it is registered with
# or without the CUDA toolkit. Always optimised (the emulation is ~10x slower
# at -O0); -fno-strict-aliasing as nvcc assumes.
add_executable(adgt_flash_sim_test ${CMAKE_CURRENT_SOURCE_DIR}/tools/flash_sim_test.cpp)
target_link_libraries(adgt_flash_sim_test PRIVATE adgt_kernels Boost::context)
target_compile_options(adgt_flash_sim_test PRIVATE -O2 -fno-strict-aliasing -Wno-unknown-pragmas)
add_test(NAME flash_attention_emulated COMMAND adgt_flash_sim_test)
set_tests_properties(flash_attention_emulated PROPERTIES LABELS cuda TIMEOUT 300)

find_program(ADGT_BASH bash)
if(NOT ADGT_BASH)
  return()
endif()
add_test(NAME cuda_check_script_syntax
  COMMAND ${ADGT_BASH} -n ${CMAKE_SOURCE_DIR}/scripts/device/check.sh)
add_test(NAME cuda_check_script_paths
  COMMAND ${ADGT_BASH} ${CMAKE_SOURCE_DIR}/scripts/device/check.sh paths)
set_tests_properties(cuda_check_script_syntax cuda_check_script_paths
  PROPERTIES LABELS cuda TIMEOUT 30)

# With the CUDA build: the check's bundle made from this build (its own
# directory), then stage 5 run from the unpacked bundle on the emulated device
# with only the bundle's libraries and its relocated Open MPI (the GPU machine
# has no MPI): the plumbing of the multi-rank GPU stage, proven here.
if(ADGT_HAVE_CUDA AND TARGET adgt-train)
  add_test(NAME cuda_check_bundle_rehearsal
    COMMAND ${CMAKE_COMMAND} -E env CHECK_BUILD_DIR=${CMAKE_BINARY_DIR} CHECK_NO_BUILD=1
      CHECK_BUNDLE_DIR=${CMAKE_BINARY_DIR}/devbundle OUT=${CMAKE_BINARY_DIR}/devcheck
      ${ADGT_BASH} -c "${CMAKE_SOURCE_DIR}/scripts/device/check.sh bundle && ${CMAKE_SOURCE_DIR}/scripts/device/check.sh rehearse")
  set_tests_properties(cuda_check_bundle_rehearsal PROPERTIES
    LABELS "cuda;parallel" TIMEOUT 600 RUN_SERIAL TRUE)
endif()
