# In-memory layout switch (issue 17; docs/reliability.md): 8 CPU ranks switch
# their layout at step boundaries as <log.dir>/switch asks, and must match
# fresh runs resumed from the same state in the target layout bit for bit
# (losses, weights, AdamW moments, named state).
if(NOT TARGET adgt-train OR NOT TARGET adgt-data OR NOT TARGET adgt_parallel)
  return()
endif()
foreach(case dense zero moe)
  add_test(NAME switch_in_memory_${case}_np8
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/switch/switch_test.py
      --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
      --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/switch --case ${case})
  set_tests_properties(switch_in_memory_${case}_np8 PROPERTIES
    FIXTURES_REQUIRED kjv_byte LABELS parallel TIMEOUT 300)
endforeach()
