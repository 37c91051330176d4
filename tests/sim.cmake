# The cluster model and the step simulator (docs/cluster.md,
# docs/simulator.md): unit tests (tests/unit/cluster_model_test.cpp and
# sim_step_test.cpp, tags [cluster] and [sim]) compiled into adgt_unit_tests.
if(NOT TARGET adgt_sim)
  return()
endif()
target_link_libraries(adgt_unit_tests PRIVATE adgt_sim)
