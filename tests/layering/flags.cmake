# Library code never names a command-line flag (tests/layering/test_no_flags.py): the scan of every
# library folder, and its self-test, which shows that a flag put into a library string is caught.
add_test(NAME layering_no_flags
         COMMAND ${TOUCHSTONE_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_no_flags.py ${CMAKE_SOURCE_DIR})
add_test(NAME layering_no_flags_self_test
         COMMAND ${TOUCHSTONE_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/test_no_flags.py --self-test)
set_tests_properties(layering_no_flags layering_no_flags_self_test PROPERTIES LABELS layering TIMEOUT 60)
