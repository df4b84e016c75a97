# ctr_train --consistency bounded --staleness S: the bound chosen at run time reaches the servers
# (ps::bounded_rule(S) in a parameter_server<ps::run_time_rule>). With one worker 6x slower the
# others run ahead as far as the bound lets them: every server's observed staleness stays
# <= S, and with S = 4 it goes past 1 (a bound ignored, or fixed at bounded<2>'s, fails one
# of the two runs). Run by ctest with -DCTR_TRAIN=... -DWORK=<scratch dir>.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")

function(max_staleness bound out_var)
  set(json "${WORK}/report-${bound}.json")
  execute_process(
    COMMAND "${CTR_TRAIN}" --synthetic 8000 --eval-samples 0 --tiny --dim 8 --batch 48
            --workers 3 --servers 1 --strategy ps --compressor none --max-steps 60
            --straggler 2:6 --consistency bounded --staleness ${bound} --report-json "${json}"
    OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "ctr_train --staleness ${bound} exited ${rc}:\n${out}\n${err}")
  endif()
  file(READ "${json}" report)
  string(JSON servers LENGTH "${report}" servers_stats)
  if(servers LESS 1)
    message(FATAL_ERROR "--staleness ${bound}: no server statistics in ${json}")
  endif()
  set(worst 0)
  math(EXPR last "${servers} - 1")
  foreach(s RANGE ${last})
    string(JSON seen GET "${report}" servers_stats ${s} max_staleness)
    if(seen GREATER worst)
      set(worst ${seen})
    endif()
  endforeach()
  set(${out_var} ${worst} PARENT_SCOPE)
endfunction()

max_staleness(1 tight)
if(tight GREATER 1)
  message(FATAL_ERROR "--staleness 1: a pull ran ${tight} steps ahead of the slowest worker")
endif()
max_staleness(4 loose)
if(loose GREATER 4)
  message(FATAL_ERROR "--staleness 4: a pull ran ${loose} steps ahead of the slowest worker")
endif()
if(NOT loose GREATER 1)
  message(FATAL_ERROR "--staleness 4 with a 6x straggler: the others never ran more than "
                      "${loose} step(s) ahead, as if the bound were still 1")
endif()
message(STATUS "max staleness observed: ${tight} (bound 1), ${loose} (bound 4)")
