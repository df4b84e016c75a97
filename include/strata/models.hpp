/// @file models.hpp
/// Everything in strata/models: the ctr_model concept, DLRM and Wide & Deep.
#pragma once

#include "strata/models/concepts.hpp"
#include "strata/models/dlrm.hpp"
#include "strata/models/wide_deep.hpp"
