# ctest script (cmake -P): installs the mlacp build tree MLACP_BUILD_DIR into WORK_DIR/prefix, then configures,
# builds and runs the consumer project CONSUMER_SOURCE_DIR against that prefix alone.
foreach(var MLACP_BUILD_DIR CONSUMER_SOURCE_DIR WORK_DIR CMAKE_GENERATOR)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "MlacpInstallTest.cmake: ${var} is not set")
  endif()
endforeach()

function(run_step)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE result)
  if(NOT result EQUAL 0)
    string(REPLACE ";" " " command "${ARGN}")
    message(FATAL_ERROR "install test: '${command}' failed (${result})")
  endif()
endfunction()

file(REMOVE_RECURSE "${WORK_DIR}")
set(prefix "${WORK_DIR}/prefix")
run_step(${CMAKE_COMMAND} --install "${MLACP_BUILD_DIR}" --prefix "${prefix}")
# The installed headers are the library: test and tool support (src/testing) stays out.
file(GLOB_RECURSE _installed_test_support "${prefix}/include/mlacp/testing/*" "${prefix}/include/mlacp/mla/synthetic.hpp"
     "${prefix}/include/mlacp/mla/reference_forward.hpp")
if(_installed_test_support)
  message(FATAL_ERROR "install test: test support was installed: ${_installed_test_support}")
endif()
run_step(
  ${CMAKE_COMMAND} -S "${CONSUMER_SOURCE_DIR}" -B "${WORK_DIR}/build" -G "${CMAKE_GENERATOR}"
  -DCMAKE_CXX_COMPILER=${CMAKE_CXX_COMPILER} "-DCMAKE_PREFIX_PATH=${prefix}"
  -DCMAKE_BUILD_TYPE=Release)
run_step(${CMAKE_COMMAND} --build "${WORK_DIR}/build")
run_step("${WORK_DIR}/build/consumer")
