/// @file init.hpp
/// `embedding::uniform_init`: the row initialiser every storage shares (defined below the
/// embedding and ps families, in core/row_init.hpp).
#pragma once

#include "strata/core/row_init.hpp"

namespace strata::embedding {
using strata::uniform_init;
}  // namespace strata::embedding
