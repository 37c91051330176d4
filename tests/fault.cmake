# Hang and death detection (docs/reliability.md): the pure
# parts in adgt_unit_tests (tests/unit/watchdog_test.cpp, tag [watchdog]);
# under mpirun, 4 CPU ranks (tp2 dp2) of the layout-test model with
# train.collective_timeout_s=5: SIGSTOP or SIGKILL of a random rank mid-run is
# named by every other rank, which all exit non-zero within 60 s of the signal
# (12x the deadline: no hang, whatever the load); a rank
# whose main thread stalls (ADGT_TEST_STALL, a stuck device) is named by its
# sequence number though its process lives; and a
# clean run with the same small deadline, evaluations and checkpoint saves does
# not trip (tests/fault/fault_check.py). The campaign: scripts/reliability/chaos.py.
if(NOT TARGET adgt_fault)
  return()
endif()
target_link_libraries(adgt_unit_tests PRIVATE adgt_fault)
if(NOT TARGET adgt-train)
  return()
endif()
foreach(mode stop kill stall clean)
  add_test(NAME watchdog_${mode}_np4
    COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/fault/fault_check.py --mode ${mode}
      --train $<TARGET_FILE:adgt-train> --data ${CMAKE_BINARY_DIR}/data/kjv-byte
      --work ${CMAKE_BINARY_DIR}/fault/${mode})
endforeach()
set_tests_properties(watchdog_stop_np4 watchdog_kill_np4 watchdog_stall_np4 watchdog_clean_np4 PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "fault;parallel" TIMEOUT 240 PROCESSORS 4 RUN_SERIAL TRUE)

# Elastic restart (docs/reliability.md, "Elastic restart"):
# scripts/adgt-elastic over 4 CPU ranks of the layout-test model in f64, the
# planner choosing each launch's layout. kill: SIGKILL of a random rank mid-run;
# the relaunch drops its slot, skips 3 ranks (no layout: global batch 16),
# resumes on 2 from the newest complete checkpoint, loses at most the
# checkpoint interval and ends with the uninterrupted single-process run's
# losses (1e-7 relative; at most 7.2e-9 measured over 20 trials); a 10 s
# collective deadline, the failed launch ending within 55 s of the kill (what
# a loaded host cannot break). grow: 2 slots, then the hostfile
# says 4: the run checkpoints, stops, and is relaunched on 4 with the same
# losses. The campaign: scripts/reliability/elastic_chaos.py --trials 20.
foreach(mode kill grow)
  add_test(NAME elastic_${mode}_np4
    COMMAND ${ADGT_PYTHON} ${CMAKE_SOURCE_DIR}/scripts/reliability/elastic_chaos.py --mode ${mode} --timeout 10
      --train $<TARGET_FILE:adgt-train> --data ${CMAKE_BINARY_DIR}/data/kjv-byte
      --work ${CMAKE_BINARY_DIR}/fault/elastic_${mode})
endforeach()
set_tests_properties(elastic_kill_np4 elastic_grow_np4 PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "fault;parallel" TIMEOUT 300 PROCESSORS 4 RUN_SERIAL TRUE)
add_test(NAME elastic_slots_unit
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/fault/elastic_slots_test.py)
set_tests_properties(elastic_slots_unit PROPERTIES LABELS fault TIMEOUT 60)
