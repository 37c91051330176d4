# End-to-end checks of adgt-train on the default corpus (King James Bible),
# prepared once into the build tree by a ctest fixture.
if(NOT TARGET adgt-train OR NOT TARGET adgt-data)
  return()
endif()
set(ADGT_KJV ${CMAKE_BINARY_DIR}/data/kjv)
add_test(NAME e2e_prepare_kjv
  COMMAND ${CMAKE_SOURCE_DIR}/scripts/prepare_data.sh ${ADGT_KJV} $<TARGET_FILE:adgt-data>)
set_tests_properties(e2e_prepare_kjv PROPERTIES FIXTURES_SETUP kjv)

foreach(check resume eval loss nan signal)
  add_test(NAME e2e_${check}
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/e2e/train_checks.py ${check}
      --train $<TARGET_FILE:adgt-train> --data ${ADGT_KJV} --work ${CMAKE_BINARY_DIR}/e2e)
  set_tests_properties(e2e_${check} PROPERTIES FIXTURES_REQUIRED kjv LABELS e2e)
endforeach()
set_tests_properties(e2e_loss PROPERTIES TIMEOUT 1200)
