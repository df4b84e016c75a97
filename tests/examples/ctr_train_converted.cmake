# Converted training data end to end (issue 18): strata_convert writes synthetic TSV days and
# converts them; ctr_train --data DIR trains from the mapped files (data::ctr_files):
#  - allreduce and ps end with the same bits (the same batches reach both strategies);
#  - a run resumed mid-epoch from a checkpoint ends with the straight run's bits (the loaders
#    start at any step, across the epoch boundary);
#  - the tables' rows come from the files: another --table-rows, or eval days hashed otherwise,
#    are refused with what to do.
# Run by ctest with -DCTR_TRAIN=... -DSTRATA_CONVERT=... -DWORK=<scratch dir>.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}/tsv")

function(run expect_rc out_var)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL expect_rc)
    message(FATAL_ERROR "exit ${rc} (expected ${expect_rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(${out_var} "${out}${err}" PARENT_SCOPE)
endfunction()

run(0 made "${STRATA_CONVERT}" --make-synthetic 6000 --distinct-ids 3000
    "${WORK}/tsv/day_0.tsv" "${WORK}/tsv/day_1.tsv" "${WORK}/tsv/day_2.tsv")
run(0 converted "${STRATA_CONVERT}" --out "${WORK}/train" --table-rows 4000 --chunk-rows 256
    "${WORK}/tsv/day_0.tsv" "${WORK}/tsv/day_1.tsv")
run(0 converted_eval "${STRATA_CONVERT}" --out "${WORK}/eval" --table-rows 4000 --chunk-rows 256
    "${WORK}/tsv/day_2.tsv")
run(0 converted_other "${STRATA_CONVERT}" --out "${WORK}/other" --table-rows 3000
    "${WORK}/tsv/day_2.tsv")
if(NOT converted MATCHES "day_1.ctrb: 6000 examples, 0 lines skipped")
  message(FATAL_ERROR "strata_convert did not report the day:\n${converted}")
endif()

set(common --data "${WORK}/train" --eval-data "${WORK}/eval" --tiny --dim 8 --batch 64
           --compressor none --shuffle-window 1024 --seed 5)
function(train out_var)
  run(0 out "${CTR_TRAIN}" ${common} ${ARGN})
  string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" sum "${out}")
  string(REGEX MATCH "eval +auc [0-9.]+" auc "${out}")
  if(sum STREQUAL "" OR auc STREQUAL "")
    message(FATAL_ERROR "no checksum or eval line: ${ARGN}\n${out}")
  endif()
  set(${out_var} "${sum}" PARENT_SCOPE)
  set(${out_var}_auc "${auc}" PARENT_SCOPE)
  set(${out_var}_out "${out}" PARENT_SCOPE)
endfunction()

train(allreduce --strategy allreduce --workers 2)
if(NOT allreduce_out MATCHES "train data: 2 file\\(s\\), 12000 examples in 48 chunks")
  message(FATAL_ERROR "the converted days were not described:\n${allreduce_out}")
endif()
train(ps --strategy ps --workers 2 --servers 1)
if(NOT allreduce STREQUAL ps)
  message(FATAL_ERROR "allreduce and ps differ on converted data:\n  ${allreduce}\n  ${ps}")
endif()
message(STATUS "allreduce = ps: ${ps}, ${allreduce_auc}")

# Mid-epoch resume across the epoch boundary (183 steps per epoch of 64 with 2 shards:
# each shard holds at least 22 chunks of 256 and the two partial ones of 112).
train(straight --strategy hybrid --workers 2 --servers 1 --epochs 2)
train(first_part --strategy hybrid --workers 2 --servers 1 --epochs 2 --max-steps 150
      --checkpoint-dir "${WORK}/ck")
train(resumed --strategy hybrid --workers 2 --servers 1 --epochs 2 --resume
      --checkpoint-dir "${WORK}/ck")
if(NOT straight STREQUAL resumed)
  message(FATAL_ERROR "the resumed run differs:\n  straight ${straight}\n  resumed ${resumed}")
endif()
message(STATUS "resumed = straight: ${resumed}")

run(1 refused "${CTR_TRAIN}" ${common} --table-rows 777)
if(NOT refused MATCHES "was hashed into tables of 4000 rows; drop --table-rows")
  message(FATAL_ERROR "--table-rows against converted data was not refused clearly:\n${refused}")
endif()
run(1 refused_eval "${CTR_TRAIN}" --data "${WORK}/train" --eval-data "${WORK}/other" --tiny)
if(NOT refused_eval MATCHES "was converted with other hashing")
  message(FATAL_ERROR "eval days hashed otherwise were not refused clearly:\n${refused_eval}")
endif()
run(1 refused_shards "${CTR_TRAIN}" ${common} --data-shards 64)
if(NOT refused_shards MATCHES "only 48 chunks")
  message(FATAL_ERROR "more shards than chunks was not refused clearly:\n${refused_shards}")
endif()
