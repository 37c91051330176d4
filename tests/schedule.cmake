# The pipeline-schedule IR (docs/pipeline-schedules.md): unit tests
# (tests/unit/schedule_*_test.cpp, tag [schedule], compiled into
# adgt_unit_tests) and the adgt-schedule tool: its bubble table must match
# every closed form and greedy must not lose to 1F1B (exit 0), --print draws
# a timeline, a bad setting is a named error (exit 2).
if(NOT TARGET adgt_pipeline)
  return()
endif()
target_link_libraries(adgt_unit_tests PRIVATE adgt_pipeline adgt_schedule_bench)

set(_sched $<TARGET_FILE:adgt-schedule>)
add_test(NAME schedule_bubble_table
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success
          "^check: greedy <= 1F1B makespan within the memory limit for every m" --
          ${_sched})
add_test(NAME schedule_print_zb_h1
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^rank 3 [|][.]{6}F0B0F1B1F2B2F3B3W0" --
          ${_sched} --print zb-h1 --pp 4 --m 8)
add_test(NAME schedule_print_bad_microbatches
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --status 2
          "parallel[.]microbatches=2 < parallel[.]pp=4: 1F1B needs at least pp micro-batches; use >= 4" --
          ${_sched} --print 1f1b --pp 4 --m 2)
# ZB-V (the vee placement) at F = B = W: the timeline ends at 3m + (p-1)/2
# (25.5 for m = 8; ZB-H1's is 27, 1F1B's 33).
add_test(NAME schedule_print_zb_v
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/expect_error.sh --success "^makespan 25[.]5, ideal 24 " --
          ${_sched} --print zb-v --pp 4 --m 8)
set_tests_properties(schedule_bubble_table schedule_print_zb_h1 schedule_print_zb_v schedule_print_bad_microbatches
  PROPERTIES LABELS schedule TIMEOUT 30)
