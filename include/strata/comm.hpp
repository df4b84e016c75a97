/// @file comm.hpp
/// Everything in strata/comm: the transport concept, thread_world and the collectives.
#pragma once

#include "strata/comm/collectives.hpp"
#include "strata/comm/concepts.hpp"
#include "strata/comm/fault.hpp"
#include "strata/comm/phase.hpp"
#include "strata/comm/thread_world.hpp"
