# Rank 1 (a worker) of a 3-process ctr_train job crashes mid-training; the job must end
# non-zero, saying which rank died; resuming from the last checkpoint must finish with the
# same model as a run that never failed. -DCRASH_PHASE=pull|push|allreduce|checkpoint makes it
# die on its CRASH_AFTER-th send of that phase (ctr_train --crash-phase); the message must name
# the phase too. Without it: its 3000th send of any phase.
if(NOT DEFINED CRASH_AFTER)
  set(CRASH_AFTER 3000)
endif()
set(crash_flags --crash-rank 1 --crash-after-sends ${CRASH_AFTER})
set(crash_names "rank 1: injected crash")
if(DEFINED CRASH_PHASE)
  list(APPEND crash_flags --crash-phase ${CRASH_PHASE})
  set(crash_names "rank 1: injected crash on send ${CRASH_AFTER} of its phase \\(to peer [0-9]+, phase '${CRASH_PHASE}'")
endif()
set(flags --tiny --synthetic 6000 --eval-samples 1000 --distinct-ids 50 --table-rows 2000
          --batch 32 --workers 2 --servers 1 --no-progress --compressor int8)
separate_arguments(mpiexec_pre UNIX_COMMAND "${MPIEXEC_PREFLAGS}")
file(REMOVE_RECURSE "${CHECKPOINTS}")
execute_process(COMMAND "${CTR_TRAIN}" ${flags} OUTPUT_VARIABLE clean_out ERROR_VARIABLE clean_err
                RESULT_VARIABLE clean_rc)
if(NOT clean_rc EQUAL 0)
  message(FATAL_ERROR "reference run failed:\n${clean_out}\n${clean_err}")
endif()
execute_process(COMMAND "${MPIEXEC}" ${MPIEXEC_NUMPROC_FLAG} 3 ${mpiexec_pre} "${CTR_TRAIN}" ${flags}
                        --checkpoint-dir "${CHECKPOINTS}" --checkpoint-every 20
                        ${crash_flags}
                OUTPUT_VARIABLE crash_out ERROR_VARIABLE crash_err RESULT_VARIABLE crash_rc)
if(crash_rc EQUAL 0)
  message(FATAL_ERROR "the job with a dead rank exited 0:\n${crash_out}\n${crash_err}")
endif()
if(NOT "${crash_out}${crash_err}" MATCHES "${crash_names}")
  message(FATAL_ERROR "the failure does not name rank 1 (and the phase): expected '${crash_names}' in\n${crash_out}\n${crash_err}")
endif()
if(NOT EXISTS "${CHECKPOINTS}/latest")
  message(FATAL_ERROR "no checkpoint was written before the crash")
endif()
file(READ "${CHECKPOINTS}/latest" latest)
execute_process(COMMAND "${MPIEXEC}" ${MPIEXEC_NUMPROC_FLAG} 3 ${mpiexec_pre} "${CTR_TRAIN}" ${flags}
                        --checkpoint-dir "${CHECKPOINTS}" --resume
                OUTPUT_VARIABLE resume_out ERROR_VARIABLE resume_err RESULT_VARIABLE resume_rc)
if(NOT resume_rc EQUAL 0)
  message(FATAL_ERROR "resume failed:\n${resume_out}\n${resume_err}")
endif()
string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" clean_sum "${clean_out}")
string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" resume_sum "${resume_out}")
if(clean_sum STREQUAL "" OR NOT clean_sum STREQUAL resume_sum)
  message(FATAL_ERROR "resumed model differs:\n never failed: ${clean_sum}\n resumed:      ${resume_sum}")
endif()
string(STRIP "${latest}" latest)
message(STATUS "rank 1 died (${crash_flags}), job exited ${crash_rc}; resumed from ${latest}: ${resume_sum}")
