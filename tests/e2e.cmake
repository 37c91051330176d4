# End-to-end checks of adgt-train on the default corpus (King James Bible),
# prepared once into the build tree by a ctest fixture.
if(NOT TARGET adgt-train OR NOT TARGET adgt-data)
  return()
endif()
set(ADGT_KJV ${CMAKE_BINARY_DIR}/data/kjv)
add_test(NAME e2e_prepare_kjv
  COMMAND ${CMAKE_SOURCE_DIR}/scripts/prepare_data.sh ${ADGT_KJV} $<TARGET_FILE:adgt-data>)
set_tests_properties(e2e_prepare_kjv PROPERTIES FIXTURES_SETUP kjv)

# The stated bound for `loss`: the tiny model at seq_len 128 reaches train and
# val loss < 5.3 within 150 steps (measured 4.93 train, 4.76 val; it starts at
# ln(4096) = 8.3).
set(_args_loss --steps 150 --bound 5.3)
foreach(check resume eval loss nan signal)
  add_test(NAME e2e_${check}
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/train_checks.py ${check}
      --train $<TARGET_FILE:adgt-train> --data ${ADGT_KJV} --work ${CMAKE_BINARY_DIR}/e2e
      ${_args_${check}})
  set_tests_properties(e2e_${check} PROPERTIES FIXTURES_REQUIRED kjv LABELS e2e TIMEOUT 900)
endforeach()
