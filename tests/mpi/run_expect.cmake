# Runs COMMAND (a list) and fails unless it exits with EXPECT_RC and its output matches EXPECT_REGEX.
# Usage: cmake -DCOMMAND=... -DEXPECT_RC=1 -DEXPECT_REGEX=... -P run_expect.cmake
execute_process(COMMAND ${COMMAND} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err)
message("${out}${err}")
if(NOT rc STREQUAL "${EXPECT_RC}")
  message(FATAL_ERROR "exit status ${rc}, expected ${EXPECT_RC}")
endif()
if(NOT "${out}${err}" MATCHES "${EXPECT_REGEX}")
  message(FATAL_ERROR "output does not match '${EXPECT_REGEX}'")
endif()
