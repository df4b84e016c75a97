/// @file serve.hpp
/// Everything in strata/serve: inference bundles (export from a checkpoint or a trainer) and
/// the predictor that answers from them.
#pragma once

#include "strata/serve/bundle.hpp"
#include "strata/serve/predictor.hpp"
