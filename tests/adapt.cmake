# Run-time adaptation's deciders (parallel/adapt/): unit tests only so far.
target_link_libraries(adgt_unit_tests PRIVATE adgt_adapt)
