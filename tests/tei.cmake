# The Training Efficiency Index (docs/tei.md): one job of three runs on 2 CPU
# ranks (stopped by SIGTERM, resumed and killed, resumed to the end); TEI over
# all three, recomputed from metrics.jsonl, with the lost steps and every
# run's wall-clock counted and the breakdown summing to 100%.
if(NOT TARGET adgt-train OR NOT TARGET adgt-data)
  return()
endif()
add_test(NAME tei_interrupted_job
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/tei/tei_check.py
    --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
    --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/tei)
set_tests_properties(tei_interrupted_job PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "e2e;parallel" TIMEOUT 180 PROCESSORS 2)
