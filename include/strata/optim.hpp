/// @file optim.hpp
/// Everything in strata/optim: the sparse_optimizer concept, SGD, SGD with momentum, Adagrad, lazy
/// Adam, FTRL and the sparse-gradient helpers (duplicate summing, row-parallel apply).
#pragma once

#include "strata/optim/adagrad.hpp"
#include "strata/optim/adam.hpp"
#include "strata/optim/concepts.hpp"
#include "strata/optim/ftrl.hpp"
#include "strata/optim/momentum.hpp"
#include "strata/optim/sgd.hpp"
#include "strata/optim/sparse_gradient.hpp"
