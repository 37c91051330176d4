# What a new user hits (docs/testing.md): the README's adgt-train journeys on
# the CPU with their promised output, exit statuses and files checked (a short
# run and its checkpoint's info, usage and input errors in every tool, a dry
# run that writes nothing, --print-schedule's ranks).
add_test(NAME newuser_walkthrough
  COMMAND ${CMAKE_CURRENT_SOURCE_DIR}/newuser/walkthrough.sh ${CMAKE_BINARY_DIR}/apps
    ${CMAKE_BINARY_DIR}/data/kjv-byte ${CMAKE_BINARY_DIR}/newuser)
set_tests_properties(newuser_walkthrough PROPERTIES
  FIXTURES_REQUIRED kjv_byte LABELS "config;newuser" TIMEOUT 300 PROCESSORS 2)
