/// @file onednn.hpp
/// What every oneDNN caller in nn shares: the process's CPU engine, a stream per thread, and
/// the switch that makes oneDNN run on the calling thread only.
///
/// Compiled only when the build found oneDNN (`STRATA_HAS_ONEDNN`).
///
/// Threads: one pool runs the machine. Debian's oneDNN runs its kernels on OpenMP; before a
/// oneDNN call, `onednn_on_this_thread_only()` sets the calling thread's OpenMP thread count
/// to 1 (the runtime's `omp_set_num_threads`, looked up once with dlsym, so nothing links
/// libgomp directly): the kernel executes on the oneTBB worker that calls it and no OpenMP
/// team is started.
#pragma once

#ifdef STRATA_HAS_ONEDNN

#include <dlfcn.h>

#include <oneapi/dnnl/dnnl.hpp>

namespace strata::nn::detail {

/// Makes oneDNN run on the calling thread only (see the file comment). Cheap after the
/// first call on a thread.
inline void onednn_on_this_thread_only() {
#if DNNL_CPU_RUNTIME == DNNL_RUNTIME_OMP
  using set_threads_fn = void (*)(int);
  static const auto set_threads =
      reinterpret_cast<set_threads_fn>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  thread_local const bool done = [] {
    if (set_threads != nullptr) set_threads(1);
    return true;
  }();
  (void)done;
#endif
}

/// The process's oneDNN CPU engine.
inline const dnnl::engine& onednn_engine() {
  static const dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

/// The calling thread's oneDNN stream on `onednn_engine()`.
inline dnnl::stream& onednn_stream() {
  thread_local dnnl::stream stream(onednn_engine());
  return stream;
}

}  // namespace strata::nn::detail

#endif  // STRATA_HAS_ONEDNN
