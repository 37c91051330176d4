# Kernel emulation (issue 12, part 6): every handwritten CUDA kernel family
# runs in the host emulation of CUDA (tests/tools/cuda_sim/) against the CPU
# backend, from the very kernel headers the CUDA backend compiles
# (kernels/cuda/*_kernels.cuh, with their launch code). Plain C++: built and
# run with or without the CUDA toolkit. See tests/kernel_sim/sim_check.hpp.
#
# Each family also has deliberate bugs (mutants): a copy of its kernel header
# with one text replaced, built into the same test, which must then fail
# (ctest kernel_sim_mutant_<name>). A mutant whose text is no longer found
# exactly once in the header stops the build, so a mutant cannot silently
# stop mutating.

# adgt_kernel_sim(<family>): tests/kernel_sim/<family>_sim_test.cpp, ctest
# kernel_sim_<family>.
function(adgt_kernel_sim family)
  add_executable(adgt_kernel_sim_${family}
    ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/${family}_sim_test.cpp)
  target_link_libraries(adgt_kernel_sim_${family} PRIVATE adgt_kernels)
  # Optimised (the emulation is ~10x slower at -O0); nvcc's aliasing rules.
  target_compile_options(adgt_kernel_sim_${family} PRIVATE -O2 -fno-strict-aliasing
    -Wno-unknown-pragmas)
  add_test(NAME kernel_sim_${family} COMMAND adgt_kernel_sim_${family})
  set_tests_properties(kernel_sim_${family} PROPERTIES LABELS "cuda;kernel_sim" TIMEOUT 300)
endfunction()

# adgt_kernel_mutant(<name> TEST <family> HEADER <kernels/cuda/x.cuh>
#                    FROM <text> TO <text>): the family's test built against
# the header with FROM (found exactly once) replaced by TO; ctest
# kernel_sim_mutant_<name> passes when that test fails by a check ("FAIL")
# or an emulation error ("cuda-sim:").
function(adgt_kernel_mutant name)
  cmake_parse_arguments(PARSE_ARGV 1 M "" "TEST;HEADER;FROM;TO" "")
  set(dir ${CMAKE_CURRENT_BINARY_DIR}/kernel_sim_mutants/${name})
  set(spec ${dir}/mutation.cmake)
  file(WRITE ${spec}.in "set(FROM [==[${M_FROM}]==])\nset(TO [==[${M_TO}]==])\n")
  configure_file(${spec}.in ${spec} COPYONLY)
  add_custom_command(OUTPUT ${dir}/${M_HEADER}
    COMMAND ${CMAKE_COMMAND} -DSPEC=${spec} -DSRC=${CMAKE_SOURCE_DIR}/${M_HEADER}
      -DOUT=${dir}/${M_HEADER} -P ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/mutate.cmake
    DEPENDS ${CMAKE_SOURCE_DIR}/${M_HEADER} ${spec}
      ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/mutate.cmake
    COMMENT "kernel mutant ${name}")
  add_executable(adgt_kernel_mutant_${name}
    ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/${M_TEST}_sim_test.cpp ${dir}/${M_HEADER})
  target_include_directories(adgt_kernel_mutant_${name} BEFORE PRIVATE ${dir})
  target_link_libraries(adgt_kernel_mutant_${name} PRIVATE adgt_kernels)
  target_compile_options(adgt_kernel_mutant_${name} PRIVATE -O2 -fno-strict-aliasing
    -Wno-unknown-pragmas)
  add_test(NAME kernel_sim_mutant_${name}
    COMMAND ${CMAKE_COMMAND} -DBIN=$<TARGET_FILE:adgt_kernel_mutant_${name}>
      -P ${CMAKE_CURRENT_SOURCE_DIR}/kernel_sim/expect_failure.cmake)
  set_tests_properties(kernel_sim_mutant_${name} PROPERTIES LABELS "cuda;kernel_sim" TIMEOUT 300)
endfunction()

adgt_kernel_sim(rmsnorm)
adgt_kernel_mutant(rmsnorm_warp_only TEST rmsnorm HEADER kernels/cuda/rmsnorm_kernels.cuh
  # the bf16 forward's row sum of squares reduced within each warp only
  FROM [[  ss = block_sum(ss, red);
  const float r = math::rmsnorm_rstd]]
  TO [[  ss = warp_sum(ss);
  const float r = math::rmsnorm_rstd]])
adgt_kernel_mutant(rmsnorm_dw_rows TEST rmsnorm HEADER kernels/cuda/rmsnorm_kernels.cuh
  # the two-pass weight gradient drops the last row block's partial
  FROM [[for (int64_t rb = 0; rb < nrb; ++rb) s += part[rb * C + c];]]
  TO [[for (int64_t rb = 0; rb + 1 < nrb; ++rb) s += part[rb * C + c];]])
