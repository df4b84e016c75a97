# ctr_train and resnet_train refuse bad flags at once, before any data is read or generated,
# with a message naming the flag, the value and what is accepted (issue 15's probes). Each case
# is "expected exit code|expected text|flag|flag..." ('|' separates everything: a ';' would split
# the case itself into list elements; '~' in the expected text stands for ';'). Run by ctest with
# -DCTR_TRAIN=... -DRESNET_TRAIN=... -DSTRATA_EXPORT=... -DHAS_ONNX=ON|OFF -DWORK=<scratch dir>.
file(REMOVE_RECURSE "${WORK}")
file(MAKE_DIRECTORY "${WORK}")
file(WRITE "${WORK}/a-file" "not a directory")
set(nodata "--data|${WORK}/no-such-file.tsv")  # a name error must come before the data error
set(cases
  "1|--on-divergence: 'maybe' is not accepted~ accepted: stop, skip|--on-divergence|maybe"
  "1|--workers: '1e10' is out of range~ accepted: integers 1 .. 1024|--workers|1e10"
  "1|--workers: '4294967297' is out of range|--workers|4294967297"
  "1|--batch: '9223372036854775808' is out of range|--batch|9223372036854775808"
  "1|--link-gbps: '0' is out of range~ accepted: [0.001, 10000]|--link-gbps|0"
  "1|--link-gbps: '-1' is out of range|--link-gbps|-1"
  "1|--link-gbps: 'nan' is not finite|--link-gbps|nan"
  "1|--link-latency-us: '-1000' is out of range|--link-latency-us|-1000"
  "1|--table-rows: '1e15' is out of range|--table-rows|1e15"
  "1|the embedding tables do not fit one process: table C1|--table-rows|1e11|--dim|64"
  "1|--crash-after-sends: '0' is out of range|--crash-rank|1|--crash-after-sends|0"
  "1|--crash-rank R and --crash-after-sends N go together|--crash-rank|1"
  "1|--crash-phase: 'pulls' is not accepted~ accepted: any, pull, push, allreduce, checkpoint|--crash-phase|pulls"
  "1|--crash-phase needs --crash-rank R and --crash-after-sends N|--crash-phase|pull"
  "1|--lr: '-1' is out of range~ accepted: (0, 1000|--lr|-1"
  "1|--dense-lr: 'nan' is not finite|--dense-lr|nan"
  "1|--epochs: '1.5' is not an integer|--epochs|1.5"
  "1|--model: 'dlrn' is not accepted~ accepted: dlrm, wide_deep|--model|dlrn|${nodata}"
  "1|--strategy: 'ring' is not accepted~ accepted: auto, allreduce, ps, hybrid|--strategy|ring|${nodata}"
  "1|--consistency: 'eventual' is not accepted|--consistency|eventual|${nodata}"
  "1|--compressor: 'int4' is not accepted~ accepted: none, fp16, int8, topk|--compressor|int4|${nodata}"
  "1|--compressor topk sparsifies the dense allreduce, which --strategy ps does not run|--strategy|ps|--compressor|topk|${nodata}"
  "1|--straggler 9:2: there are 4 workers (0 to 3)|--straggler|9:2|${nodata}"
  "1|--advise needs the cluster's network: --link-gbps G|--advise|${nodata}"
  "1|--advise: with --consistency async and --servers 0 there is nothing to compare|--advise|--link-gbps|10|--consistency|async|--servers|0|${nodata}"
  "1|--straggler: '0.5' is out of range~ accepted: [1, 1000]|--straggler|1:0.5"
  "1|--straggler '3' must be WORKER:FACTOR|--straggler|3"
  "1|--bottom-mlp: '0' is out of range~ accepted: integers 1 .. 65536|--bottom-mlp|512-0"
  "1|--top-mlp '1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1' has 17 layers|--top-mlp|1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1-1"
  "1|--bottom-mlp: Wide & Deep has no bottom MLP|--model|wide_deep|--bottom-mlp|64|${nodata}"
  "1|--gemm: 'mkl' is not accepted~ accepted: cblas, onednn, eigen|--gemm|mkl"
  "1|--strategy allreduce is always synchronous|--strategy|allreduce|--consistency|async|${nodata}"
  "1|--staleness bounds --consistency bounded~ with --consistency async drop it|--consistency|async|--staleness|3|${nodata}"
  "1|--staleness: '16777216' is out of range~ accepted: integers 0 .. 16777215|--staleness|16777216"
  "1|exists and is not a directory|--checkpoint-dir|${WORK}/a-file|${nodata}"
  "1|--resume needs --checkpoint-dir|--resume|${nodata}"
  "1|the directory ${WORK}/no-such-dir does not exist|--trace|${WORK}/no-such-dir/t.json|${nodata}"
  "1|unknown flag '--worker'|--worker|2"
  "1|--export-precision: 'int4' is not accepted~ accepted: fp32, fp16, int8|--export|${WORK}/bundle|--export-precision|int4|${nodata}"
  "1|--export-precision needs --export DIR|--export-precision|fp16|${nodata}"
  "1|exists and is not an empty directory|--export|${WORK}|${nodata}"
  "1|flag --export needs a value|--export"
  "1|flag --seed needs a value|--seed"
  "0|usage: ctr_train|--help")
foreach(case IN LISTS cases)
  string(REPLACE "|" ";" parts "${case}")
  list(POP_FRONT parts want_rc want_text)
  string(REPLACE "~" ";" want_text "${want_text}")
  execute_process(COMMAND "${CTR_TRAIN}" --no-progress ${parts} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
  string(FIND "${out}${err}" "${want_text}" at)
  if(NOT rc STREQUAL want_rc OR at EQUAL -1)
    message(FATAL_ERROR "ctr_train ${parts}: exit ${rc} (want ${want_rc}), want the text\n"
                        "  ${want_text}\ngot:\n${out}${err}")
  endif()
endforeach()
# The checkpoint directory is created (and proven writable) before the data is read.
execute_process(COMMAND "${CTR_TRAIN}" --checkpoint-dir "${WORK}/new/ckpt"
                        --data "${WORK}/no-such-file.tsv"
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
if(rc EQUAL 0 OR NOT IS_DIRECTORY "${WORK}/new/ckpt")
  message(FATAL_ERROR "--checkpoint-dir was not created before the data was read:\n${out}${err}")
endif()
# --max-steps beyond the data says so (and trains what there is).
execute_process(COMMAND "${CTR_TRAIN}" --tiny --synthetic 2000 --eval-samples 200 --batch 100
                        --workers 1 --table-rows 1000 --max-steps 1000 --no-progress
                RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
string(FIND "${out}${err}" "--max-steps 1000 is beyond the data: 1 epoch(s) of 20 steps" at)
if(NOT rc EQUAL 0 OR at EQUAL -1)
  message(FATAL_ERROR "--max-steps beyond the data: exit ${rc}\n${out}${err}")
endif()

# --export writes an inference bundle of the final model; strata_export writes one from the
# run's checkpoint (issue 16) and prints the AUC change of its precision with --eval.
if(STRATA_EXPORT)
  set(e2e "${WORK}/export")
  execute_process(COMMAND "${CTR_TRAIN}" --tiny --synthetic 2000 --eval-samples 200 --batch 100
                          --workers 2 --servers 1 --strategy ps --table-rows 1000 --no-progress
                          --checkpoint-dir "${e2e}/ckpt" --checkpoint-every 20
                          --export "${e2e}/bundle" --export-precision fp16
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  string(FIND "${out}${err}" "exported fp16 bundle" at)
  if(NOT rc EQUAL 0 OR at EQUAL -1 OR NOT EXISTS "${e2e}/bundle/manifest.txt")
    message(FATAL_ERROR "ctr_train --export: exit ${rc}\n${out}${err}")
  endif()
  execute_process(COMMAND "${STRATA_EXPORT}" "${e2e}/ckpt" "${e2e}/int8" --precision int8
                          --eval "${FIXTURES}/criteo_small.tsv"
                  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
  string(FIND "${out}${err}" "AUC fp32" at)
  if(NOT rc EQUAL 0 OR at EQUAL -1 OR NOT EXISTS "${e2e}/int8/table-025.int8")
    message(FATAL_ERROR "strata_export --precision int8 --eval: exit ${rc}\n${out}${err}")
  endif()
  set(export_cases
    "0|usage: strata_export|--help"
    "1|--precision: 'int4' is not accepted~ accepted: fp32, fp16, int8|${e2e}/ckpt|${e2e}/x|--precision|int4"
    "1|needs CHECKPOINT_DIR and BUNDLE_DIR (got 1 names)|${e2e}/ckpt"
    "1|already exists and is not empty|${e2e}/ckpt|${e2e}/int8"
    "1|--top-mlp: '0' is out of range|${e2e}/ckpt|${e2e}/x|--top-mlp|0"
    "1|the dlrm shapes tried have|${e2e}/ckpt|${e2e}/x|--top-mlp|32,1"
    "1|unknown flag '--precison'|--precison|fp16"
    "1|flag --onnx needs a value|${e2e}/int8|--onnx"
    "1|or BUNDLE_DIR with --onnx FILE|${e2e}/int8")
  # --onnx: the bundle's ONNX model (strata::onnx builds), or the sentence naming the packages.
  if(HAS_ONNX)
    execute_process(COMMAND "${STRATA_EXPORT}" "${e2e}/ckpt" "${e2e}/with-onnx" --onnx
                            "${e2e}/onnx/m.onnx"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
    string(FIND "${out}${err}" "26 fp32 table files" at)
    if(NOT rc EQUAL 0 OR at EQUAL -1 OR NOT EXISTS "${e2e}/onnx/m.table-025.f32")
      message(FATAL_ERROR "strata_export --onnx: exit ${rc}\n${out}${err}")
    endif()
    execute_process(COMMAND "${STRATA_EXPORT}" "${e2e}/int8" --onnx "${e2e}/onnx/int8.onnx"
                    RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 120)
    if(NOT rc EQUAL 0 OR NOT EXISTS "${e2e}/onnx/int8.onnx")
      message(FATAL_ERROR "strata_export BUNDLE --onnx: exit ${rc}\n${out}${err}")
    endif()
    list(APPEND export_cases
      "1|m.table-000.f32 already exists~ choose another model name|${e2e}/int8|--onnx|${e2e}/onnx/m.onnx"
      "1|already exists~ choose another model name|${e2e}/ckpt|${e2e}/new|--onnx|${e2e}/onnx/m.onnx"
      "1|--precision applies to a checkpoint export|${e2e}/int8|--onnx|${e2e}/x.onnx|--precision|fp16"
      "1|is not an inference bundle (no manifest.txt)|${e2e}/ckpt|--onnx|${e2e}/x.onnx")
  else()
    list(APPEND export_cases
      "1|built without ONNX export~ install ONNX and protobuf (Debian: apt-get install libonnx-dev libprotobuf-dev)|${e2e}/int8|--onnx|${e2e}/x.onnx")
  endif()
  foreach(case IN LISTS export_cases)
    string(REPLACE "|" ";" parts "${case}")
    list(POP_FRONT parts want_rc want_text)
    string(REPLACE "~" ";" want_text "${want_text}")
    execute_process(COMMAND "${STRATA_EXPORT}" ${parts} RESULT_VARIABLE rc
                    OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 60)
    string(FIND "${out}${err}" "${want_text}" at)
    if(NOT rc STREQUAL want_rc OR at EQUAL -1)
      message(FATAL_ERROR "strata_export ${parts}: exit ${rc} (want ${want_rc}), want the text\n"
                          "  ${want_text}\ngot:\n${out}${err}")
    endif()
  endforeach()
  if(EXISTS "${e2e}/new")
    message(FATAL_ERROR "strata_export CHECKPOINT new --onnx EXISTING wrote the bundle before refusing")
  endif()
endif()

set(resnet_cases
  "0|usage: resnet_train|--help"
  "1|--workers: '0' is out of range~ accepted: integers 1 .. 256|--workers|0"
  "1|--lr: 'nan' is not finite|--lr|nan"
  "1|--batch: '-5' is negative|--batch|-5"
  "1|--compress: 'int4' is not accepted~ accepted: none, fp16, int8|--compress|int4"
  "1|--conv: 'fft' is not accepted~ accepted: winograd, onednn, im2col|--conv|fft"
  "1|unknown flag '--epoch'|--epoch|2"
  "1|--checkpoint-every: '0' is out of range|--checkpoint-every|0"
  "1|resume needs a checkpoint directory|--resume"
  "1|resume and resume_from both set|--resume|--checkpoint-dir|/tmp/x|--resume-from|/tmp/y")
foreach(case IN LISTS resnet_cases)
  string(REPLACE "|" ";" parts "${case}")
  list(POP_FRONT parts want_rc want_text)
  string(REPLACE "~" ";" want_text "${want_text}")
  execute_process(COMMAND "${RESNET_TRAIN}" ${parts} RESULT_VARIABLE rc
                  OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 30)
  string(FIND "${out}${err}" "${want_text}" at)
  if(NOT rc STREQUAL want_rc OR at EQUAL -1)
    message(FATAL_ERROR "resnet_train ${parts}: exit ${rc} (want ${want_rc}), want the text\n"
                        "  ${want_text}\ngot:\n${out}${err}")
  endif()
endforeach()
message(STATUS "every bad flag refused with its message")
