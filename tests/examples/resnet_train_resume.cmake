# examples/resnet_train with --checkpoint-dir, then --resume-from its first epoch's checkpoint:
# the resumed run prints the parameter checksum of the straight run (checkpoints at epoch ends
# carry parameters, optimizer state, batch-norm running statistics and the int8 residual).
# Needs Fashion-MNIST in DATA_DIR: without it the test prints SKIP.
if(NOT EXISTS "${DATA_DIR}/train-images-idx3-ubyte.gz")
  message(STATUS "SKIP: no Fashion-MNIST in ${DATA_DIR} (Debian: apt install dataset-fashion-mnist)")
  return()
endif()
file(REMOVE_RECURSE "${WORK}")
set(flags --workers 2 --batch 32 --depth-n 1 --train-limit 320 --test-limit 200 --epochs 2
          --compress int8 --augment --data-dir "${DATA_DIR}")
function(run_resnet out_var)
  execute_process(COMMAND "${RESNET_TRAIN}" ${flags} ${ARGN} OUTPUT_VARIABLE out
                  ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "resnet_train ${ARGN} failed (${rc}):\n${out}\n${err}")
  endif()
  string(REGEX MATCH "parameters [0-9a-f]+" sum "${out}")
  set(${out_var} "${sum}" PARENT_SCOPE)
endfunction()
run_resnet(straight --checkpoint-dir "${WORK}/a")
if(NOT EXISTS "${WORK}/a/step-10/state.ckpt")
  message(FATAL_ERROR "no checkpoint at the end of epoch 1 (${WORK}/a/step-10)")
endif()
run_resnet(resumed --resume-from "${WORK}/a/step-10" --checkpoint-dir "${WORK}/b")
if(straight STREQUAL "" OR NOT straight STREQUAL resumed)
  message(FATAL_ERROR "the resumed run differs: straight '${straight}', resumed '${resumed}'")
endif()
message(STATUS "resumed = straight: ${resumed}")
