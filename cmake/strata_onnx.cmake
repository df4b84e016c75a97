# Optional ONNX export target strata::onnx (serve::export_onnx, include/strata/serve/onnx.hpp):
# exists when Debian's libonnx-dev and libprotobuf-dev are found (STRATA_ONNX=AUTO) or required
# (ON). The core library stays header-only and free of ONNX: only programs that export link
# strata::onnx (ONNX's protobuf classes and checker, libonnx.so + libprotobuf.so). Without it,
# serve::export_onnx still compiles and raises strata::error naming the packages to install.
set(STRATA_ONNX "AUTO" CACHE STRING
    "Build the ONNX export target strata::onnx (libonnx-dev, libprotobuf-dev): AUTO (when found), ON or OFF")
set_property(CACHE STRATA_ONNX PROPERTY STRINGS AUTO ON OFF)
set(STRATA_HAS_ONNX OFF)

if(NOT STRATA_ONNX STREQUAL "OFF")
  # ONNX's package config names protobuf::libprotobuf without finding it: find Protobuf first.
  find_package(Protobuf QUIET)
  if(Protobuf_FOUND)
    find_package(ONNX CONFIG QUIET)
  endif()
  if(Protobuf_FOUND AND ONNX_FOUND AND TARGET onnx AND TARGET onnx_proto)
    add_library(strata_onnx INTERFACE)
    add_library(strata::onnx ALIAS strata_onnx)
    set_target_properties(strata_onnx PROPERTIES EXPORT_NAME onnx)
    target_link_libraries(strata_onnx INTERFACE strata onnx onnx_proto protobuf::libprotobuf)
    target_compile_definitions(strata_onnx INTERFACE STRATA_HAS_ONNX)
    install(TARGETS strata_onnx EXPORT strataTargets)
    set(STRATA_HAS_ONNX ON)
    message(STATUS "strata: ONNX export with ONNX ${ONNX_VERSION} (protobuf ${Protobuf_VERSION}), target strata::onnx")
  elseif(STRATA_ONNX STREQUAL "ON")
    message(FATAL_ERROR "strata: STRATA_ONNX=ON but ONNX or protobuf was not found (Debian: "
                        "apt-get install libonnx-dev libprotobuf-dev), or use -DSTRATA_ONNX=OFF")
  else()
    message(STATUS "strata: no ONNX (Debian: libonnx-dev libprotobuf-dev) - serve::export_onnx "
                   "and strata_export --onnx report that they are unavailable")
  endif()
endif()
