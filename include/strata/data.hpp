/// @file data.hpp
/// Everything in strata/data: CTR batches and datasets, the Criteo TSV reader, the synthetic
/// Criteo generator, metrics (AUC, log loss, accuracy), the sharded sampler and, when zlib is
/// available, the IDX / Fashion-MNIST reader.
#pragma once

#include "strata/data/batch.hpp"
#include "strata/data/criteo.hpp"
#include "strata/data/metrics.hpp"
#include "strata/data/sampler.hpp"
#include "strata/data/synthetic.hpp"
#if __has_include(<zlib.h>)
#include "strata/data/idx.hpp"
#endif
