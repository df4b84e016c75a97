/// @file nn.hpp
/// Everything in strata/nn: flat parameters, linear layers, activations, BCE loss, DLRM dot
/// interaction, concatenation, MLPs and dense optimizers.
#pragma once

#include "strata/nn/activations.hpp"
#include "strata/nn/common.hpp"
#include "strata/nn/concat.hpp"
#include "strata/nn/gemm.hpp"
#include "strata/nn/gemm_engine.hpp"
#include "strata/nn/interaction.hpp"
#include "strata/nn/linear.hpp"
#include "strata/nn/loss.hpp"
#include "strata/nn/mlp.hpp"
#include "strata/nn/optimizers.hpp"
#include "strata/nn/parameters.hpp"
