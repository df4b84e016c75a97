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

# Frequency thresholding: --min-count counts the training days into a vocabulary, the eval day
# is converted through it (--vocabulary) into its own folder, ctr_train trains the smaller
# tables (allreduce = ps still), refuses eval data read otherwise, and its bundle carries the
# vocabulary (raw lines map as in training: tests/serve).
run(0 counted "${STRATA_CONVERT}" --out "${WORK}/vtrain" --table-rows 4000 --chunk-rows 256
    --min-count 3 "${WORK}/tsv/day_0.tsv" "${WORK}/tsv/day_1.tsv")
if(NOT counted MATCHES "vocabulary.ctrv: frequency threshold 3 \\(counted over 2 file\\(s\\), 12000 examples\\)")
  message(FATAL_ERROR "strata_convert --min-count did not report the vocabulary:\n${counted}")
endif()
run(0 veval "${STRATA_CONVERT}" --out "${WORK}/veval" --table-rows 4000 --chunk-rows 256
    --vocabulary "${WORK}/vtrain/vocabulary.ctrv" "${WORK}/tsv/day_2.tsv")
if(NOT veval MATCHES "these days are read through it")
  message(FATAL_ERROR "strata_convert --vocabulary did not say so:\n${veval}")
endif()
set(vcommon --data "${WORK}/vtrain" --eval-data "${WORK}/veval" --tiny --dim 8 --batch 64
            --compressor none --shuffle-window 1024 --seed 5)
foreach(strategy allreduce ps)
  run(0 v_${strategy} "${CTR_TRAIN}" ${vcommon} --strategy ${strategy} --workers 2 --servers 1
      --export "${WORK}/vbundle-${strategy}")
  string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" v_${strategy}_sum
         "${v_${strategy}}")
endforeach()
if(v_allreduce_sum STREQUAL "" OR NOT v_allreduce_sum STREQUAL v_ps_sum)
  message(FATAL_ERROR "thresholded data: allreduce and ps differ:\n${v_allreduce}\n${v_ps}")
endif()
if(NOT v_allreduce MATCHES "frequency-threshold vocabulary" OR
   NOT v_allreduce MATCHES "frequency threshold 3" OR v_allreduce_sum STREQUAL allreduce)
  message(FATAL_ERROR "thresholded data was not read through its vocabulary:\n${v_allreduce}")
endif()
string(REGEX MATCH "eval +auc ([0-9.]+)" _ "${v_allreduce}")
if(CMAKE_MATCH_1 STREQUAL "" OR CMAKE_MATCH_1 LESS 0.6)
  message(FATAL_ERROR "thresholded data did not learn (eval AUC ${CMAKE_MATCH_1}):\n${v_allreduce}")
endif()
file(READ "${WORK}/vbundle-ps/manifest.txt" manifest)
if(NOT EXISTS "${WORK}/vbundle-ps/vocabulary.ctrv" OR NOT manifest MATCHES "hash.vocabulary vocabulary.ctrv")
  message(FATAL_ERROR "the bundle does not carry the vocabulary:\n${manifest}")
endif()
message(STATUS "thresholded: allreduce = ps: ${v_ps_sum}")

# The checkpoints keep the vocabulary beside them: strata_export finds it (its bundle answers
# the raw eval day with the trainer's AUC), and a resume without it is refused.
run(0 v_ck "${CTR_TRAIN}" ${vcommon} --strategy ps --workers 2 --servers 1 --max-steps 40
    --checkpoint-dir "${WORK}/vck" --checkpoint-every 40)
if(NOT EXISTS "${WORK}/vck/vocabulary.ctrv")
  message(FATAL_ERROR "the checkpoint directory does not keep the vocabulary")
endif()
string(REGEX MATCH "eval @ step 40: auc ([0-9.]+)" _ "${v_ck}")
set(trained_auc "${CMAKE_MATCH_1}")
run(0 v_exported "${STRATA_EXPORT}" "${WORK}/vck" "${WORK}/vbundle-ck" --eval
    "${WORK}/tsv/day_2.tsv")
string(REGEX MATCH "AUC fp32 ([0-9.]+)" _ "${v_exported}")
set(exported_auc "${CMAKE_MATCH_1}")  # before if(MATCHES) resets CMAKE_MATCH_1
if(NOT v_exported MATCHES "kept with the checkpoints" OR trained_auc STREQUAL "" OR
   NOT exported_auc STREQUAL trained_auc)
  message(FATAL_ERROR "strata_export did not answer the raw eval day as the trainer "
                      "(${trained_auc}):\n${v_ck}\n${v_exported}")
endif()
run(0 v_other "${STRATA_CONVERT}" --out "${WORK}/vdiff" --table-rows 4000 --min-count 5
    "${WORK}/tsv/day_0.tsv")
run(1 v_refused_export "${STRATA_EXPORT}" "${WORK}/vck" "${WORK}/vbundle-diff" --vocabulary
    "${WORK}/vdiff/vocabulary.ctrv")
if(NOT v_refused_export MATCHES "is not the vocabulary the checkpoints were trained through")
  message(FATAL_ERROR "strata_export with another vocabulary was not refused:\n${v_refused_export}")
endif()
run(1 v_refused_resume "${CTR_TRAIN}" ${common} --resume --checkpoint-dir "${WORK}/vck")
if(NOT v_refused_resume MATCHES "trained through the vocabulary kept beside them")
  message(FATAL_ERROR "a resume without the vocabulary was not refused:\n${v_refused_resume}")
endif()
message(STATUS "exported from the checkpoint: eval AUC ${trained_auc} as trained")

run(1 v_refused_eval "${CTR_TRAIN}" --data "${WORK}/vtrain" --eval-data "${WORK}/eval" --tiny)
if(NOT v_refused_eval MATCHES "was converted with other hashing.*no vocabulary")
  message(FATAL_ERROR "eval days without the vocabulary were not refused clearly:\n${v_refused_eval}")
endif()
run(1 v_refused_tsv "${CTR_TRAIN}" --data "${WORK}/vtrain" --eval-data "${WORK}/tsv/day_2.tsv" --tiny)
if(NOT v_refused_tsv MATCHES "a TSV file is not")
  message(FATAL_ERROR "a TSV eval file beside thresholded data was not refused:\n${v_refused_tsv}")
endif()
run(1 v_refused_rows "${CTR_TRAIN}" ${vcommon} --table-rows 4000)
if(NOT v_refused_rows MATCHES "is read through its vocabulary")
  message(FATAL_ERROR "--table-rows against thresholded data was not refused:\n${v_refused_rows}")
endif()
run(1 v_refused_again "${STRATA_CONVERT}" --out "${WORK}/vtrain" --table-rows 4000 --min-count 2
    --overwrite "${WORK}/tsv/day_0.tsv" --vocabulary "${WORK}/vtrain/vocabulary.ctrv")
if(NOT v_refused_again MATCHES "give one")
  message(FATAL_ERROR "--min-count with --vocabulary was not refused:\n${v_refused_again}")
endif()
run(1 v_refused_exists "${STRATA_CONVERT}" --out "${WORK}/vtrain" --table-rows 4000
    --min-count 2 "${WORK}/tsv/day_2.tsv")
if(NOT v_refused_exists MATCHES "exists: the days of that folder are read through it")
  message(FATAL_ERROR "a second count into a folder was not refused:\n${v_refused_exists}")
endif()
run(1 v_refused_hash "${STRATA_CONVERT}" --out "${WORK}/vother" --table-rows 3000
    --vocabulary "${WORK}/vtrain/vocabulary.ctrv" "${WORK}/tsv/day_2.tsv")
if(NOT v_refused_hash MATCHES "was counted over keys hashed into tables of 4000 rows")
  message(FATAL_ERROR "a vocabulary of other hashing was not refused:\n${v_refused_hash}")
endif()

# Streaming a TSV (--stream: no conversion, resident memory bounded) deals the same batches as
# the day converted with chunks of 4096: the same model, bit for bit.
run(0 c4096 "${STRATA_CONVERT}" --out "${WORK}/c4096" --table-rows 4000 --seed 1
    "${WORK}/tsv/day_0.tsv")
set(scommon --tiny --dim 8 --batch 64 --compressor none --shuffle-window 8192 --seed 1
            --strategy hybrid --workers 2 --servers 1 --eval-data "${WORK}/eval")
run(0 from_ctrb "${CTR_TRAIN}" --data "${WORK}/c4096" ${scommon})
run(0 from_tsv "${CTR_TRAIN}" --data "${WORK}/tsv/day_0.tsv" --stream --table-rows 4000
    ${scommon})
string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" sum_ctrb "${from_ctrb}")
string(REGEX MATCH "checksum dense / embeddings +[0-9a-f]+ / [0-9a-f]+" sum_tsv "${from_tsv}")
if(sum_ctrb STREQUAL "" OR NOT sum_ctrb STREQUAL sum_tsv)
  message(FATAL_ERROR "streamed TSV and the converted day differ:\n${from_ctrb}\n${from_tsv}")
endif()
if(NOT from_tsv MATCHES "1 TSV file\\(s\\) streamed, 6000 examples in 2 chunks")
  message(FATAL_ERROR "the streamed TSV was not described:\n${from_tsv}")
endif()
message(STATUS "streamed TSV = converted: ${sum_tsv}")
