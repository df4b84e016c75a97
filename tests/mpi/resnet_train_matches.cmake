# Runs examples/resnet_train with 2 workers as threads and as 2 MPI processes (mpiexec) with the
# same flags and checks that both print the same checksum of the final parameters (issue 14:
# `mpiexec -n 2 resnet_train` equals the threaded run). Needs Fashion-MNIST in DATA_DIR: without
# it the test prints SKIP (ctest's SKIP_REGULAR_EXPRESSION reports it skipped).
if(NOT EXISTS "${DATA_DIR}/train-images-idx3-ubyte.gz")
  message(STATUS "SKIP: no Fashion-MNIST in ${DATA_DIR} (Debian: apt install dataset-fashion-mnist)")
  return()
endif()
set(flags --batch 32 --depth-n 1 --train-limit 320 --test-limit 200 --epochs 1 --augment
          --compress int8 --data-dir "${DATA_DIR}")
separate_arguments(mpiexec_pre UNIX_COMMAND "${MPIEXEC_PREFLAGS}")
execute_process(COMMAND "${RESNET_TRAIN}" --workers 2 ${flags} OUTPUT_VARIABLE threads_out
                ERROR_VARIABLE threads_err RESULT_VARIABLE threads_rc)
if(NOT threads_rc EQUAL 0)
  message(FATAL_ERROR "threaded run failed (${threads_rc}):\n${threads_out}\n${threads_err}")
endif()
execute_process(COMMAND "${MPIEXEC}" ${MPIEXEC_NUMPROC_FLAG} 2 ${mpiexec_pre} "${RESNET_TRAIN}"
                        ${flags}
                OUTPUT_VARIABLE mpi_out ERROR_VARIABLE mpi_err RESULT_VARIABLE mpi_rc)
if(NOT mpi_rc EQUAL 0)
  message(FATAL_ERROR "mpiexec run failed (${mpi_rc}):\n${mpi_out}\n${mpi_err}")
endif()
string(REGEX MATCH "2 workers, [0-9]+ epochs, final test accuracy [0-9.]+, parameters [0-9a-f]+"
       threads_sum "${threads_out}")
string(REGEX MATCH "2 workers, [0-9]+ epochs, final test accuracy [0-9.]+, parameters [0-9a-f]+"
       mpi_sum "${mpi_out}")
if(threads_sum STREQUAL "" OR NOT threads_sum STREQUAL mpi_sum)
  message(FATAL_ERROR "results differ:\n threads: ${threads_sum}\n mpi:     ${mpi_sum}\n"
                      "${threads_out}\n${mpi_out}\n${mpi_err}")
endif()
message(STATUS "same model under threads and mpiexec: ${mpi_sum}")
