# Runs examples/ctr_train in-process (threads) and under mpiexec with the same flags and
# checks that both print the same checksums of the final model (issue: same seed + sync ⇒
# same model whatever the transport). Invoked by ctest with -D variables set.
set(flags --tiny --synthetic 6000 --eval-samples 1000 --distinct-ids 50 --table-rows 2000
          --batch 32 --workers 2 --servers 1 --no-progress ${EXTRA_FLAGS})
separate_arguments(mpiexec_pre UNIX_COMMAND "${MPIEXEC_PREFLAGS}")
execute_process(COMMAND "${CTR_TRAIN}" ${flags} OUTPUT_VARIABLE threads_out ERROR_VARIABLE threads_err
                RESULT_VARIABLE threads_rc)
if(NOT threads_rc EQUAL 0)
  message(FATAL_ERROR "in-process run failed (${threads_rc}):\n${threads_out}\n${threads_err}")
endif()
execute_process(COMMAND "${MPIEXEC}" ${MPIEXEC_NUMPROC_FLAG} ${RANKS} ${mpiexec_pre} "${CTR_TRAIN}" ${flags}
                OUTPUT_VARIABLE mpi_out ERROR_VARIABLE mpi_err RESULT_VARIABLE mpi_rc)
if(NOT mpi_rc EQUAL 0)
  message(FATAL_ERROR "mpiexec run failed (${mpi_rc}):\n${mpi_out}\n${mpi_err}")
endif()
string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" threads_sum "${threads_out}")
string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" mpi_sum "${mpi_out}")
if(threads_sum STREQUAL "" OR NOT threads_sum STREQUAL mpi_sum)
  message(FATAL_ERROR "checksums differ:\n threads: ${threads_sum}\n mpi:     ${mpi_sum}\n${mpi_out}\n${mpi_err}")
endif()
message(STATUS "same model under threads and mpiexec: ${mpi_sum}")
