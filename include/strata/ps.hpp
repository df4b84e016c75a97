/// @file ps.hpp
/// Everything in strata/ps: layouts, partitioning, consistency policies, wire protocol, server
/// and client; plus the `embedding::sharded` storage built on them.
#pragma once

#include "strata/embedding/sharded.hpp"
#include "strata/ps/client.hpp"
#include "strata/ps/consistency.hpp"
#include "strata/ps/layout.hpp"
#include "strata/ps/partition.hpp"
#include "strata/ps/protocol.hpp"
#include "strata/ps/server.hpp"
