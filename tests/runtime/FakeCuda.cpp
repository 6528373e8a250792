// A stand-in for libcuda.so.1 with just enough behaviour for Driver::probe: it exports every
// symbol FlexTile resolves, and FLEXTILE_FAKE_CUDA_MODE picks what cuInit and cuDeviceGetCount
// say ("init_fails", "no_devices", or anything else for one healthy device). It exports the
// pre-12.8 cuEventElapsedTime only, so a successful probe also shows the fallback lookup works.
#include <cstdlib>
#include <cstring>

namespace {

int mode() {
  const char* value = std::getenv("FLEXTILE_FAKE_CUDA_MODE");
  if (value && std::strcmp(value, "init_fails") == 0) return 1;
  if (value && std::strcmp(value, "no_devices") == 0) return 2;
  return 0;
}

constexpr int kNotSupported = 801;  // what every other entry point answers

}  // namespace

extern "C" {

int cuInit(unsigned) { return mode() == 1 ? 100 : 0; }  // CUDA_ERROR_NO_DEVICE
int cuDriverGetVersion(int* version) {
  *version = 12040;
  return 0;
}
int cuDeviceGetCount(int* count) {
  *count = mode() == 2 ? 0 : 1;
  return 0;
}
int cuGetErrorName(int error, const char** name) {
  *name = error == 100 ? "CUDA_ERROR_NO_DEVICE" : "CUDA_ERROR_FAKE";
  return 0;
}
int cuGetErrorString(int, const char** description) {
  *description = "reported by the fake driver";
  return 0;
}

int cuDeviceGet(...) { return kNotSupported; }
int cuDeviceGetName(...) { return kNotSupported; }
int cuDeviceGetAttribute(...) { return kNotSupported; }
int cuDeviceTotalMem_v2(...) { return kNotSupported; }
int cuDevicePrimaryCtxRetain(...) { return kNotSupported; }
int cuCtxSetCurrent(...) { return kNotSupported; }
int cuCtxSynchronize(...) { return kNotSupported; }
int cuMemGetInfo_v2(...) { return kNotSupported; }
int cuMemAlloc_v2(...) { return kNotSupported; }
int cuMemFree_v2(...) { return kNotSupported; }
int cuMemcpyHtoD_v2(...) { return kNotSupported; }
int cuMemcpyDtoH_v2(...) { return kNotSupported; }
int cuMemcpyDtoD_v2(...) { return kNotSupported; }
int cuMemsetD8_v2(...) { return kNotSupported; }
int cuMemcpyHtoDAsync_v2(...) { return kNotSupported; }
int cuMemcpyDtoHAsync_v2(...) { return kNotSupported; }
int cuMemsetD8Async(...) { return kNotSupported; }
int cuLinkCreate_v2(...) { return kNotSupported; }
int cuLinkAddData_v2(...) { return kNotSupported; }
int cuLinkComplete(...) { return kNotSupported; }
int cuLinkDestroy(...) { return kNotSupported; }
int cuModuleLoadDataEx(...) { return kNotSupported; }
int cuModuleGetFunction(...) { return kNotSupported; }
int cuModuleUnload(...) { return kNotSupported; }
int cuFuncGetAttribute(...) { return kNotSupported; }
int cuFuncSetAttribute(...) { return kNotSupported; }
int cuLaunchKernel(...) { return kNotSupported; }
int cuStreamCreate(...) { return kNotSupported; }
int cuStreamSynchronize(...) { return kNotSupported; }
int cuStreamDestroy_v2(...) { return kNotSupported; }
int cuEventCreate(...) { return kNotSupported; }
int cuEventRecord(...) { return kNotSupported; }
int cuEventSynchronize(...) { return kNotSupported; }
int cuEventElapsedTime(...) { return kNotSupported; }
int cuEventDestroy_v2(...) { return kNotSupported; }

}  // extern "C"
