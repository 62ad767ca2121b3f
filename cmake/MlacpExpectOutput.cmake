# ctest script (cmake -P): runs a command and checks its exit status and its output (stdout and stderr together)
# against several patterns, each of which must match on its own, in any order.
#   -DCOMMAND=<;-list>  the command and its arguments
#   -DEXPECT_EXIT=zero|nonzero
#   -DEXPECT=<;-list>   regular expressions that must all match the output
#   -DREJECT=<;-list>   regular expressions that must not match it (optional)
foreach(var COMMAND EXPECT_EXIT EXPECT)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "MlacpExpectOutput.cmake: ${var} is not set")
  endif()
endforeach()
string(REPLACE "|" ";" COMMAND "${COMMAND}")
string(REPLACE "|" ";" EXPECT "${EXPECT}")
string(REPLACE "|" ";" REJECT "${REJECT}")
execute_process(
  COMMAND ${COMMAND}
  RESULT_VARIABLE result
  OUTPUT_VARIABLE out
  ERROR_VARIABLE out)
message("${out}")
set(ok TRUE)
if(EXPECT_EXIT STREQUAL "zero" AND NOT result EQUAL 0)
  message("expect-output: exit status ${result}, expected 0")
  set(ok FALSE)
elseif(EXPECT_EXIT STREQUAL "nonzero" AND result EQUAL 0)
  message("expect-output: exit status 0, expected non-zero")
  set(ok FALSE)
endif()
foreach(pattern IN LISTS EXPECT)
  if(NOT out MATCHES "${pattern}")
    message("expect-output: output does not match '${pattern}'")
    set(ok FALSE)
  endif()
endforeach()
foreach(pattern IN LISTS REJECT)
  if(out MATCHES "${pattern}")
    message("expect-output: output matches rejected '${pattern}'")
    set(ok FALSE)
  endif()
endforeach()
if(NOT ok)
  message(FATAL_ERROR "expect-output: FAILED")
endif()
message("expect-output: OK")
