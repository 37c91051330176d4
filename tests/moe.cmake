# The mixture-of-experts block (core/moe.hpp): expert parallelism at 1, 2 and
# 4 ranks against one process on the union of the tokens
# (tests/tools/moe_ep_test.cpp), and the layer against an independent PyTorch
# float64 implementation (tests/torch/moe_ref.py, fed by adgt-moe-dump). The
# finite-difference and hand-made cases are Catch2 tests in tests/unit/moe_test.cpp.
add_executable(adgt-moe-dump ${CMAKE_CURRENT_SOURCE_DIR}/tools/moe_dump.cpp)
target_link_libraries(adgt-moe-dump PRIVATE adgt_core CLI11::CLI11)
foreach(dt f32 f64)
  add_test(NAME moe_torch_${dt}
    COMMAND ${CMAKE_COMMAND} -E env OMP_NUM_THREADS=2 sh -c
      "$<TARGET_FILE:adgt-moe-dump> --out moe_${dt}.h5 --dtype ${dt} && ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/moe_ref.py moe_${dt}.h5"
    WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
  set_tests_properties(moe_torch_${dt} PROPERTIES LABELS "torch;moe" TIMEOUT 120)
endforeach()

if(NOT TARGET adgt_parallel)
  return()
endif()
add_executable(adgt_moe_ep_test ${CMAKE_CURRENT_SOURCE_DIR}/tools/moe_ep_test.cpp)
target_link_libraries(adgt_moe_ep_test PRIVATE adgt_parallel)
foreach(n 1 2 4)
  add_test(NAME moe_ep_np${n}
    COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^moe-ep: ok on ${n} ranks" --
            timeout 120 ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh ${n} $<TARGET_FILE:adgt_moe_ep_test>)
  set_tests_properties(moe_ep_np${n} PROPERTIES LABELS "parallel;moe" TIMEOUT 150 PROCESSORS 2)
endforeach()
