# A checkpoint written before named trainer state (format version 2 with the
# state packed into meta/rng_state; tests/checkpoint/v2_moe_fixture) resumes
# with the old build's losses (1e-7 relative: their last bits differ between
# CPUs) and is saved back as named entries, bit for bit.
if(NOT TARGET adgt-train)
  return()
endif()
add_test(NAME checkpoint_v2_compat_resume
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/checkpoint/v2_compat_check.py
          --train $<TARGET_FILE:adgt-train> --data ${CMAKE_BINARY_DIR}/data/kjv-byte
          --work ${CMAKE_BINARY_DIR}/checkpoint_v2_compat)
set_tests_properties(checkpoint_v2_compat_resume PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS checkpoint TIMEOUT 120)
