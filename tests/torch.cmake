# The whole model against an independent PyTorch LLaMA (tests/torch/): the
# adgt-reference-dump tool trains tests/torch/ref_model.yaml for a few steps and
# records logits, gradients, losses and weights; compare_reference.py recomputes
# them in float64 with PyTorch and checks relative errors per dtype.
# Needs ${ADGT_PYTHON} with torch, h5py and numpy (Debian: python3-torch python3-h5py).

# The comparison itself, without adgt: a float32 dump made by the PyTorch
# reference passes, a float64 one with a single perturbed gradient entry fails.
add_test(NAME torch_compare_selftest
  COMMAND ${CMAKE_COMMAND} -E env OMP_NUM_THREADS=2 sh -c
    "${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/make_fake_dump.py --config ${CMAKE_CURRENT_SOURCE_DIR}/torch/ref_model.yaml --out fake_f32.h5 --dtype f32 && ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/compare_reference.py fake_f32.h5 && ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/make_fake_dump.py --config ${CMAKE_CURRENT_SOURCE_DIR}/torch/ref_model.yaml --out fake_bad.h5 --dtype f64 --perturb grad && ! ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/compare_reference.py fake_bad.h5"
  WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
set_tests_properties(torch_compare_selftest PROPERTIES LABELS "torch" TIMEOUT 300)

if(TARGET adgt-reference-dump)
  foreach(dt f32 f64)
    add_test(NAME torch_reference_${dt}
      COMMAND ${CMAKE_COMMAND} -E env OMP_NUM_THREADS=2 sh -c
        "$<TARGET_FILE:adgt-reference-dump> --config ${CMAKE_CURRENT_SOURCE_DIR}/torch/ref_model.yaml --out ref_${dt}.h5 --dtype ${dt} && ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/torch/compare_reference.py ref_${dt}.h5"
      WORKING_DIRECTORY ${CMAKE_CURRENT_BINARY_DIR})
    set_tests_properties(torch_reference_${dt} PROPERTIES LABELS "torch" TIMEOUT 300)
  endforeach()
else()
  message(STATUS "adgt-reference-dump not built: torch_reference_{f32,f64} tests not registered")
endif()
