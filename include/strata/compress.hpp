/// @file compress.hpp
/// Everything in strata/compress: the compressor concept, the codecs (identity, fp16,
/// int8_block, topk), error feedback and the compressed ring allreduce.
#pragma once

#include "strata/compress/compressed_allreduce.hpp"
#include "strata/compress/concepts.hpp"
#include "strata/compress/error_feedback.hpp"
#include "strata/compress/fp16.hpp"
#include "strata/compress/identity.hpp"
#include "strata/compress/int8_block.hpp"
#include "strata/compress/keyed_error_feedback.hpp"
#include "strata/compress/per_path.hpp"
#include "strata/compress/topk.hpp"
