# Run-time adaptation's deciders (parallel/adapt/): unit tests only so far.
target_link_libraries(adgt_unit_tests PRIVATE adgt_adapt)

if(NOT TARGET adgt-train OR NOT TARGET adgt-data)
  return()
endif()
# parallel.adapt: schedule on pp = 4 with a slow rank: the warm-up re-plan
# from measured stage times, logged, with the plain run's losses bit for bit.
# (tests/adapt/schedule_adapt_test.py --case onset injects the straggler
# mid-run, emulate.slow_ranks "2:2@30"; not a ctest: on this 2-core host,
# loaded by the suite's other tests, the stage times it detects on are noise.)
foreach(case start)
  add_test(NAME adapt_schedule_slow_rank_${case}_pp4
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/adapt/schedule_adapt_test.py --case ${case}
      --train $<TARGET_FILE:adgt-train> --mpirun ${CMAKE_CURRENT_SOURCE_DIR}/parallel/mpirun.sh
      --data ${CMAKE_BINARY_DIR}/data/kjv-byte --work ${CMAKE_BINARY_DIR}/adapt/${case})
  set_tests_properties(adapt_schedule_slow_rank_${case}_pp4 PROPERTIES
    FIXTURES_REQUIRED kjv_byte LABELS "parallel;adapt" TIMEOUT 180 PROCESSORS 2)
endforeach()
