# Optional MPI target strata::mpi (the MPI transport); CPU builds without MPI keep working.
# (Filled in by the MPI transport work; until then no strata::mpi target exists.)
