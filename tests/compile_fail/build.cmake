# compile_fail_build (tests/CMakeLists.txt): builds TARGET, the translation unit of every
# tests/compile_fail file, which must not compile, and writes the compiler's output to LOG for
# the compile_fail_<name> tests to read. Fails when the unit compiled: then no file was refused.
foreach(var BUILD_DIR TARGET LOG)
  if(NOT DEFINED ${var})
    message(FATAL_ERROR "compile_fail/build.cmake: -D${var}=... is missing")
  endif()
endforeach()
file(REMOVE "${LOG}")
execute_process(COMMAND "${CMAKE_COMMAND}" --build "${BUILD_DIR}" --target "${TARGET}"
                OUTPUT_VARIABLE output ERROR_VARIABLE output RESULT_VARIABLE result)
file(WRITE "${LOG}" "${output}")
if(result EQUAL 0)
  message(FATAL_ERROR "${TARGET} compiled: none of the tests/compile_fail files was refused "
                      "(the compiler's output: ${LOG})")
endif()
message(STATUS "${TARGET} was refused, as it must be; the compiler's output: ${LOG}")
