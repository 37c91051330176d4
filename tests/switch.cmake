# In-memory layout switch (docs/reliability.md): 8 CPU ranks switch
# their layout at step boundaries as <log.dir>/switch asks, and must match
# fresh runs resumed from the same state in the target layout bit for bit
# (losses, weights, AdamW moments, named state).
if(NOT TARGET adgt-train OR NOT TARGET adgt-data OR NOT TARGET adgt_parallel)
  return()
endif()
# The pieces travel the fastest way the host allows (cross-memory reads
# here); the dense case also through the shared-memory window and as
# messages, the ways a host without cross-memory rights (or several nodes)
# takes; and the fallback to the window when one rank's reads are refused.
foreach(case dense zero zero23 cp moe fp8 dense:window dense:messages dense:fallback)
  string(REPLACE ":" ";" parts ${case})
  list(GET parts 0 model)
  list(LENGTH parts n)
  set(exchange auto)
  set(name ${model})
  if(n GREATER 1)
    list(GET parts 1 exchange)
    set(name ${model}_${exchange})
  endif()
  add_test(NAME switch_in_memory_${name}_np8
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/switch/switch_test.py
      --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
      --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/switch --case ${model}
      --exchange ${exchange})
  set_tests_properties(switch_in_memory_${name}_np8 PROPERTIES
    FIXTURES_REQUIRED kjv_byte LABELS parallel TIMEOUT 300)
endforeach()
