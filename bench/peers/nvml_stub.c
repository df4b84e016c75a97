/* Stub libnvidia-ml.so.1 (NVML) for the CPU-only Python environment of strata's FBGEMM peers.
 *
 * bench/peers/venv.sh builds this with the system cc into DIR/lib/libnvidia-ml.so.1, and
 * DIR/bin/peer-python puts DIR/lib on LD_LIBRARY_PATH.
 *
 * Why it exists: NVML ships with the NVIDIA driver, which the machines that run these peers do not
 * have. fbgemm-gpu-cpu 1.9.0 itself does not link NVML (no nvml* symbol among the undefined
 * symbols of its .so files), but the PyPI torch 2.14.1 wheel (the CUDA build, the only Linux build
 * on PyPI) opens libnvidia-ml.so.1 at run time: torch.cuda.device_count() -> _raw_device_count_nvml()
 * (ctypes: nvmlInit, nvmlDeviceGetCount_v2, nvmlDeviceGetHandleByIndex_v2, nvmlDeviceGetUUID), and
 * c10_cuda's DriverAPI / libtorch_cuda's IPC code (dlsym, asserting that every name resolves). This
 * stub answers all of them consistently as "NVML works, there are 0 GPUs": the init calls succeed,
 * the device count is 0, and everything that needs a device returns an NVML error. So
 * torch.cuda.device_count() is 0 without a "Can't initialize NVML" warning, and nothing asserts.
 *
 * Every function is declared here without NVML's headers (not installed); the signatures only need
 * to agree with NVML's at the ABI level (pointers, unsigned ints and enums as int).
 */

#include <stddef.h>

typedef int nvmlReturn_t;
typedef void *nvmlDevice_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
};

#define EXPORT __attribute__((visibility("default")))

/* --- initialisation: succeeds, so callers go on to ask for the device count --- */
EXPORT nvmlReturn_t nvmlInit(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return NVML_SUCCESS; }
EXPORT nvmlReturn_t nvmlShutdown(void) { return NVML_SUCCESS; }

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    default: return "Unknown Error (strata NVML stub: no NVIDIA driver)";
    }
}

/* --- zero devices --- */
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) {
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) { return nvmlDeviceGetCount(count); }

/* --- no driver behind it: what needs a driver (the CUDA driver version) is "library not found" --- */
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *version) {
    (void)version;
    return NVML_ERROR_LIBRARY_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *version) {
    (void)version;
    return NVML_ERROR_LIBRARY_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    (void)version; (void)length;
    return NVML_ERROR_LIBRARY_NOT_FOUND;
}

/* --- device look-ups: there is no device to find --- */
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    (void)index; (void)device;
    return NVML_ERROR_INVALID_ARGUMENT; /* index >= count (0), as the real NVML answers */
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex(index, device);
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    (void)uuid; (void)device;
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pci_bus_id, nvmlDevice_t *device) {
    (void)pci_bus_id; (void)device;
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pci_bus_id, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId(pci_bus_id, device);
}

/* --- per-device queries: never reached with 0 devices; refuse anyway --- */
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    (void)device; (void)uuid; (void)length;
    return NVML_ERROR_INVALID_ARGUMENT;
}
EXPORT nvmlReturn_t nvmlDeviceGetP2PStatus(nvmlDevice_t a, nvmlDevice_t b, int index, int *status) {
    (void)a; (void)b; (void)index; (void)status;
    return NVML_ERROR_INVALID_ARGUMENT;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemoteDeviceType(nvmlDevice_t device, unsigned int link,
                                                        int *type) {
    (void)device; (void)link; (void)type;
    return NVML_ERROR_INVALID_ARGUMENT;
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkRemotePciInfo_v2(nvmlDevice_t device, unsigned int link,
                                                        void *pci) {
    (void)device; (void)link; (void)pci;
    return NVML_ERROR_INVALID_ARGUMENT;
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t device, unsigned int *count,
                                                         void *infos) {
    (void)device; (void)count; (void)infos;
    return NVML_ERROR_INVALID_ARGUMENT;
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t device,
                                                            unsigned int *count, void *infos) {
    return nvmlDeviceGetComputeRunningProcesses(device, count, infos);
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuFabricInfoV(nvmlDevice_t device, void *info) {
    (void)device; (void)info;
    return NVML_ERROR_NOT_SUPPORTED;
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, void *memory) {
    (void)device; (void)memory;
    return NVML_ERROR_INVALID_ARGUMENT;
}
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t device, void *utilization) {
    (void)device; (void)utilization;
    return NVML_ERROR_INVALID_ARGUMENT;
}
