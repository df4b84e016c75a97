# Tables larger than one process (issue 18): every rank of the job runs under an address-space
# limit (`prlimit --as=LIMIT ctr_train ...`: the limit is each rank's, not mpiexec's) of what
# the program maps at start-up plus 640 MiB (1 GiB in all without CUDA; a CUDA build maps
# ~575 MiB of cuBLAS more), which the embedding tables exceed with one server process but fit
# when three server processes share the rows.
#  1. With 3 servers the job trains, writes a checkpoint, resumes from it and ends with the
#     model of a run that never stopped; rank 0 reports rows per server and bytes per row.
#  2. The same job with 1 server is refused at start-up on every rank (errc::out_of_memory)
#     naming the table, the rows per server it needs, the bytes per row, the limit and the
#     least --servers that fits.
#  3. The failure that check prevents, for real: 1 server with the check skipped
#     (STRATA_SKIP_TABLE_MEMORY_CHECK=1) and enough samples to touch ~2/3 of the rows (~1 GiB of
#     them): the server's row store hits std::bad_alloc while training, answers out_of_memory,
#     and the job ends non-zero with that message — no hang.
# Invoked by ctest with -DCTR_TRAIN, -DMPIEXEC, -DMPIEXEC_NUMPROC_FLAG, -DMPIEXEC_PREFLAGS,
# -DPRLIMIT, -DCHECKPOINTS.
#
# Sizes: 26 tables x 24576 rows of dim 256 with Adagrad (2 KiB a row). Worst case (every row
# touched) 1680 MiB on one server, 885 MiB on each of two, 442 MiB on each of three (a server's
# 64 lock stripes then hold 128 rows each: chunks of 2^k rows fit exactly). A rank maps ~0.2-0.4
# GiB before it holds a row (Open MPI, oneTBB, glibc; MALLOC_ARENA_MAX=2 keeps glibc's 64 MiB
# arenas to two; ~0.8 GiB more with CUDA's libraries), so start-up + 640 MiB: three servers fit,
# one or two do not.
set(limit 4294967296)  # bytes per rank: 4 GiB while the start-up size is measured
set(common --tiny --strategy ps --compressor none --eval-samples 0 --distinct-ids 1000000
           --table-rows 24576 --dim 256 --batch 2000 --no-progress)
separate_arguments(mpiexec_pre UNIX_COMMAND "${MPIEXEC_PREFLAGS}")
set(ENV{MALLOC_ARENA_MAX} 2)
file(REMOVE_RECURSE "${CHECKPOINTS}")

function(run_job ranks servers out_var err_var rc_var)
  execute_process(COMMAND "${MPIEXEC}" ${MPIEXEC_NUMPROC_FLAG} ${ranks} ${mpiexec_pre}
                          "${PRLIMIT}" --as=${limit} "${CTR_TRAIN}" ${common} --servers ${servers}
                          ${ARGN}
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc TIMEOUT 200)
  set(${out_var} "${out}" PARENT_SCOPE)
  set(${err_var} "${err}" PARENT_SCOPE)
  set(${rc_var} "${rc}" PARENT_SCOPE)
endfunction()

# 0. What a rank of the 4-rank job maps at start-up (VmSize, as its report says: libraries and
# MPI's shared memory), and the limit above it.
run_job(4 3 probe_out probe_err probe_rc --synthetic 4000 --max-steps 1)
if(NOT probe_rc EQUAL 0 OR NOT "${probe_out}${probe_err}" MATCHES "RLIMIT_AS 4096 MiB - ([0-9]+) MiB in use \\(VmSize\\)")
  message(FATAL_ERROR "the probe run did not report its VmSize (${probe_rc}):\n${probe_out}\n${probe_err}")
endif()
math(EXPR limit_mib "${CMAKE_MATCH_1} + 640")
math(EXPR limit "${limit_mib} * 1048576")

# 1. Three servers: 6 steps and a checkpoint, ...
run_job(4 3 first_out first_err first_rc --synthetic 24000 --max-steps 6
        --checkpoint-dir "${CHECKPOINTS}" --checkpoint-every 6)
if(NOT first_rc EQUAL 0)
  message(FATAL_ERROR "three servers under a ${limit_mib} MiB limit failed (${first_rc}):\n${first_out}\n${first_err}")
endif()
set(report "embedding: 26 tables \\(C1 .. C26\\) of 24576 rows over 3 server\\(s\\): 8192 rows of each table per server, 212992 rows per server process, 2075.4 bytes per row at most \\(2048 B weights \\+ Adagrad state, the rest key and index; every row [0-9.]+ on average with the lock stripes' chunks\\) = [0-9.]+ MiB per server process at most; this process may allocate RLIMIT_AS ${limit_mib} MiB - [0-9]+ MiB in use \\(VmSize\\) = [0-9]+ MiB")
if(NOT "${first_out}${first_err}" MATCHES "${report}")
  message(FATAL_ERROR "no start-up report of rows per server and bytes per row:\nexpected '${report}' in\n${first_out}\n${first_err}")
endif()
if(NOT EXISTS "${CHECKPOINTS}/latest")
  message(FATAL_ERROR "no checkpoint written:\n${first_out}\n${first_err}")
endif()
# ... resumed to step 12, ...
run_job(4 3 resume_out resume_err resume_rc --synthetic 24000 --max-steps 12
        --checkpoint-dir "${CHECKPOINTS}" --resume)
if(NOT resume_rc EQUAL 0)
  message(FATAL_ERROR "resume under a ${limit_mib} MiB limit failed (${resume_rc}):\n${resume_out}\n${resume_err}")
endif()
# ... ends with the model of 12 steps without a stop.
run_job(4 3 whole_out whole_err whole_rc --synthetic 24000 --max-steps 12)
if(NOT whole_rc EQUAL 0)
  message(FATAL_ERROR "the 12-step run failed (${whole_rc}):\n${whole_out}\n${whole_err}")
endif()
string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" resumed "${resume_out}")
string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" whole "${whole_out}")
if(whole STREQUAL "" OR NOT whole STREQUAL resumed)
  message(FATAL_ERROR "resumed model differs:\n never stopped: ${whole}\n resumed:       ${resumed}")
endif()

# 2. One server: refused at start-up, non-zero, with the sentence.
run_job(2 1 one_out one_err one_rc --synthetic 24000 --max-steps 12)
if(one_rc EQUAL 0)
  message(FATAL_ERROR "one server under a ${limit_mib} MiB limit exited 0:\n${one_out}\n${one_err}")
endif()
set(refusal "out_of_memory: the embedding tables do not fit one server process: table C1 \\(and each of 26 tables \\(C1 .. C26\\) of 24576 rows over 1 server\\(s\\)\\) needs 24576 rows per server, up to 2075.4 bytes per row \\(2048 B weights \\+ Adagrad state, the rest key and index\\): 638976 rows = [0-9.]+ MiB per server process, but this process may allocate RLIMIT_AS ${limit_mib} MiB - [0-9]+ MiB in use \\(VmSize\\) = [0-9]+ MiB; run --servers 3 or more")
if(NOT "${one_err}" MATCHES "${refusal}")
  message(FATAL_ERROR "the one-server job did not fail with the out-of-memory sentence:\nexpected '${refusal}' in\n${one_out}\n${one_err}")
endif()

# 3. One server without the check: the server runs out while training; the job ends non-zero
# with the server's out_of_memory (raised by the worker), not a hang.
set(ENV{STRATA_SKIP_TABLE_MEMORY_CHECK} 1)
run_job(2 1 oom_out oom_err oom_rc --synthetic 120000)
unset(ENV{STRATA_SKIP_TABLE_MEMORY_CHECK})
if(oom_rc EQUAL 0)
  message(FATAL_ERROR "one server without the check exited 0 (it should run out of memory):\n${oom_out}\n${oom_err}")
endif()
# Usually a request's row creation fails (the server answers, the worker raises it); should a
# message buffer of the server's receive loop fail first, rank 1 itself ends saying so.
set(oom "(out_of_memory: ps server 0 \\(rank 1\\): out of memory serving table C[0-9]+ \\([0-9]+\\), of which it holds [0-9]+ rows; this server holds [0-9]+ rows of every table in [0-9]+ MiB|ctr_train: out of memory in MPI rank 1 \\(RLIMIT_AS ${limit_mib} MiB)")
if(NOT "${oom_out}${oom_err}" MATCHES "${oom}")
  message(FATAL_ERROR "the job that ran out of memory did not say so:\nexpected '${oom}' in\n${oom_out}\n${oom_err}")
endif()
string(REGEX MATCH "needs [0-9]+ rows per server[^;]*; run --servers [0-9]+ or more" said "${one_err}")
string(REGEX MATCH "${oom}[^;]*" ran_out "${oom_out}${oom_err}")
message(STATUS "3 servers trained, checkpointed and resumed (${resumed}); 1 server refused (${said}); without the check it ran out: ${ran_out}")
