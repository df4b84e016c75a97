# Optional MPI target strata::mpi (the MPI transport, include/strata/mpi/*.hpp): exists when MPI
# is found (STRATA_MPI=AUTO) or required (ON); CPU builds without MPI keep working.
set(STRATA_MPI "AUTO" CACHE STRING "Build the MPI target: AUTO (when MPI is found), ON or OFF")
set_property(CACHE STRATA_MPI PROPERTY STRINGS AUTO ON OFF)
set(STRATA_HAS_MPI OFF)

if(NOT STRATA_MPI STREQUAL "OFF")
  if(STRATA_MPI STREQUAL "ON")
    find_package(MPI COMPONENTS CXX)
    if(NOT MPI_CXX_FOUND)
      message(FATAL_ERROR "STRATA_MPI=ON but no MPI (C++) was found; install one (Debian: "
                          "apt-get install libopenmpi-dev openmpi-bin), or use -DSTRATA_MPI=OFF")
    endif()
  else()
    find_package(MPI QUIET COMPONENTS CXX)
  endif()
endif()

if(MPI_CXX_FOUND)
  file(GLOB strata_mpi_headers CONFIGURE_DEPENDS
       RELATIVE "${CMAKE_CURRENT_SOURCE_DIR}" "include/strata/mpi/*.hpp")
  add_library(strata_mpi INTERFACE)
  add_library(strata::mpi ALIAS strata_mpi)
  set_target_properties(strata_mpi PROPERTIES EXPORT_NAME mpi
                                              VERIFY_INTERFACE_HEADER_SETS ${STRATA_VERIFY_HEADERS})
  target_link_libraries(strata_mpi INTERFACE strata MPI::MPI_CXX)
  target_sources(strata_mpi INTERFACE FILE_SET HEADERS BASE_DIRS include FILES ${strata_mpi_headers})
  install(TARGETS strata_mpi EXPORT strataTargets FILE_SET HEADERS DESTINATION ${CMAKE_INSTALL_INCLUDEDIR})
  set(STRATA_HAS_MPI ON)
  message(STATUS "strata: MPI ${MPI_CXX_VERSION} (${MPIEXEC_EXECUTABLE}), target strata::mpi")
elseif(NOT STRATA_MPI STREQUAL "OFF")
  message(STATUS "strata: no MPI found, strata::mpi is not built")
endif()

# bench/bench_allreduce_mpi.cpp is globbed by bench/CMakeLists.txt (linked to strata::strata
# only): once every directory is processed, link it to strata::mpi, or keep it out of `all`
# when there is no MPI.
function(_strata_mpi_bench_fixup)
  if(NOT TARGET bench_allreduce_mpi)
    return()
  endif()
  if(TARGET strata::mpi)
    target_link_libraries(bench_allreduce_mpi PRIVATE strata::mpi)
  else()
    set_target_properties(bench_allreduce_mpi PROPERTIES EXCLUDE_FROM_ALL ON)
  endif()
endfunction()
cmake_language(DEFER CALL _strata_mpi_bench_fixup)
