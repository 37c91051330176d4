# The cost model (parallel/cost/): its unit tests (tests/unit/flops_test.cpp,
# memory_estimate_test.cpp, pipeline_stages_test.cpp; tags [flops], [dryrun],
# [pipeline_stages]) are compiled into adgt_unit_tests.
if(NOT TARGET adgt_cost)
  return()
endif()
target_link_libraries(adgt_unit_tests PRIVATE adgt_cost)
