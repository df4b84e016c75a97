/// @file core.hpp
/// Everything in strata/core: errors, buffers, matrix views, counter-based RNG, timers, progress.
#pragma once

#include "strata/core/buffer.hpp"
#include "strata/core/error.hpp"
#include "strata/core/matrix.hpp"
#include "strata/core/progress.hpp"
#include "strata/core/rng.hpp"
#include "strata/core/timer.hpp"
