# mlacp_optional_dependency(): how every optional dependency of mlacp (MlacpNccl.cmake, MlacpOneDnn.cmake) is
# switched, found and reported. Installed with mlacp: its package config includes those modules again, with
# MLACP_ENABLE_<NAME> set to what the build found (ON or OFF), so that a find_package(mlacp) consumer gets the same
# dependency, or the same error where it is missing.
#
#   mlacp_optional_dependency(
#     NAME <NAME>        switch MLACP_ENABLE_<NAME>: AUTO (default where unset), ON (fail when not found) or OFF
#                        (or another CMake boolean); result MLACP_HAVE_<NAME>: ON or OFF (build_config.hpp's definition)
#     FEATURE <text>     what it switches, for the status lines: "mlacp: <text> ON (<found>)" / "... OFF (...)"
#     PACKAGE <text>     what is looked for: "<text> not found"
#     HINT <text>        how to point CMake at it, ending the error when ON and not found
#     FIND <macro>)      <macro>(<found_var> <searched_var>) finds the dependency and defines its imported target; it
#                        sets <found_var> to what it found (empty when not found) and <searched_var> to what it
#                        looked for and where (for the error). Not called when the switch is off.
#
# A macro, and FIND one too: the search runs in the including scope, so find_package's variables (CUDAToolkit_*,
# dnnl_*) are seen there, in mlacp's build as in a consumer's after find_package(mlacp). Its own variables are
# _mlacp_optdep_*.
include_guard(GLOBAL)

macro(mlacp_optional_dependency)
  cmake_parse_arguments(_mlacp_optdep "" "NAME;FEATURE;PACKAGE;HINT;FIND" "" ${ARGN})
  foreach(_mlacp_optdep_arg NAME FEATURE PACKAGE HINT FIND)
    if(NOT _mlacp_optdep_${_mlacp_optdep_arg})
      message(FATAL_ERROR "mlacp_optional_dependency: ${_mlacp_optdep_arg} is not set")
    endif()
  endforeach()
  if(_mlacp_optdep_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "mlacp_optional_dependency: unexpected arguments '${_mlacp_optdep_UNPARSED_ARGUMENTS}'")
  endif()
  set(_mlacp_optdep_switch MLACP_ENABLE_${_mlacp_optdep_NAME})

  if(NOT DEFINED ${_mlacp_optdep_switch})
    set(${_mlacp_optdep_switch} AUTO)
  endif()
  set(MLACP_HAVE_${_mlacp_optdep_NAME} OFF)
  string(TOUPPER "${${_mlacp_optdep_switch}}" _mlacp_optdep_mode)
  if(NOT _mlacp_optdep_mode MATCHES "^(AUTO|ON|OFF|TRUE|FALSE|YES|NO|1|0)$")
    message(FATAL_ERROR "mlacp: ${_mlacp_optdep_switch}='${${_mlacp_optdep_switch}}', expected AUTO, ON or OFF")
  endif()

  if(NOT _mlacp_optdep_mode MATCHES "^(OFF|FALSE|NO|0)$")
    set(_mlacp_optdep_found "")
    set(_mlacp_optdep_searched "")
    cmake_language(CALL ${_mlacp_optdep_FIND} _mlacp_optdep_found _mlacp_optdep_searched)
    if(_mlacp_optdep_found)
      set(MLACP_HAVE_${_mlacp_optdep_NAME} ON)
      message(STATUS "mlacp: ${_mlacp_optdep_FEATURE} ON (${_mlacp_optdep_found})")
    elseif(_mlacp_optdep_mode MATCHES "^(ON|TRUE|YES|1)$")
      message(FATAL_ERROR "mlacp: ${_mlacp_optdep_switch}=ON but ${_mlacp_optdep_PACKAGE} was not found "
                          "(${_mlacp_optdep_searched}); ${_mlacp_optdep_HINT}")
    else()
      message(STATUS "mlacp: ${_mlacp_optdep_FEATURE} OFF (${_mlacp_optdep_PACKAGE} not found)")
    endif()
  endif()
endmacro()
