# The rooms of parallel/ against the build's drawing (tests/layering/check_rooms.py):
# no file includes a room its library does not link, the links form no cycle,
# nothing lies at the top of parallel/, core/ and kernels/ include nothing above
# them; and the checker's own self-test (each rule catches a planted violation).
add_test(NAME layering_rooms
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layering/check_rooms.py ${CMAKE_SOURCE_DIR})
add_test(NAME layering_rooms_self_test
  COMMAND ${ADGT_PYTHON} ${CMAKE_CURRENT_SOURCE_DIR}/layering/check_rooms.py --self-test)
set_tests_properties(layering_rooms layering_rooms_self_test PROPERTIES LABELS layering TIMEOUT 60)
