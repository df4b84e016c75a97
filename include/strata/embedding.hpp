/// @file embedding.hpp
/// Everything in strata/embedding that lives in this process: the storage concept, row
/// initialisation, dense `local` tables, `hash_table` tables and pooled (bag) lookups.
#pragma once

#include "strata/embedding/concepts.hpp"
#include "strata/embedding/hash_table.hpp"
#include "strata/embedding/init.hpp"
#include "strata/embedding/local.hpp"
#include "strata/embedding/pooled.hpp"
