# Runs skip_probe (PROBE) three ways and checks the exit codes ctest relies on: a skipped case
# makes the program exit 77 (SKIP_RETURN_CODE) although it has no assertion (--warn
# NoAssertions, as ctest runs every test), a failure still fails, a clean run exits 0, and a
# filter that matches no case fails (a grouped file's "[#test_x]" after a rename).
function(expect_exit code)
  execute_process(COMMAND "${PROBE}" --warn NoAssertions ${ARGN} RESULT_VARIABLE got OUTPUT_VARIABLE out
                  ERROR_VARIABLE out)
  if(NOT got EQUAL code)
    message(FATAL_ERROR "skip_probe ${ARGN}: exit ${got}, expected ${code}\n${out}")
  endif()
endfunction()
expect_exit(77)                   # passes + skips
expect_exit(0 "[passes]")         # passes only
expect_exit(1 "[skips],[fails]")  # a failure wins over a skip
expect_exit(1 "[fails_then_skips]")  # a failed assertion in a case that then skips
expect_exit(1 "[no_such_tag]")       # no case ran
expect_exit(1 --filenames-as-tags "[#no_such_file]")
expect_exit(0 --filenames-as-tags "[#skip_probe][passes]")  # the file tag selects
message(STATUS "skip exit codes: 77 / 0 / 1 as expected")
