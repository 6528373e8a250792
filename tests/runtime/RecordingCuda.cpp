// A stand-in for libcuda.so.1 that behaves like one healthy sm_90 GPU without running anything:
// device memory is host memory, copies copy, kernels do not run. It writes one line per call that
// matters to the streams and to the cubin cache into the file $FLEXTILE_FAKE_CUDA_LOG:
//   launch <kernel> stream <CUstream>        htod <bytes> stream <CUstream|sync>
//   dtoh <bytes> stream <CUstream|sync>      memset <bytes> stream <CUstream|sync>
//   link <kernel bytes of PTX>               load ptx | load cubin | refuse image
//   alloc <address> <bytes>                  free <address>
// The "cubin" its linker makes is "FAKECUBIN " plus the PTX's length; cuModuleLoadDataEx loads PTX
// text and such images and refuses anything else (CUDA_ERROR_INVALID_IMAGE), so a test can plant a
// corrupt cubin; FLEXTILE_FAKE_CUDA_LINK_FAILS=1 makes its linker refuse any PTX. Tests point FLEXTILE_CUDA_LIBRARY here (tests/runtime/StreamsAndCubinTest.cpp).
//
// cuTensorMapEncodeTiled logs every argument as it arrived, one line:
//   tensormap dtype <n> rank <r> address <p> dims <d,...> strides <s,...> box <b,...>
//             elementstrides <e,...> interleave <i> swizzle <s> l2 <l> oobfill <f>
// (strides: rank - 1 entries) and writes a map whose 16 words are 0x7E45_0000_0000_0000 + i + 1,
// so a test can tell the driver's bytes from any other. It refuses a map not 64-byte aligned, as
// the driver requires, and any map when FLEXTILE_FAKE_CUDA_TENSOR_MAP_FAILS=1 (CUDA_ERROR_INVALID_VALUE).
// cuLaunchKernelEx logs "launchex" lines (below), with the geometry and attributes it read.
// Stream capture and graph launch are emulated (below): work queued on the stream being captured
// is logged with " (captured)", and a call a graph cannot hold (a synchronous copy or wait, an
// upload from host memory on the captured stream, an allocation or free) is refused and breaks the
// capture.
// Built with FLEXTILE_FAKE_CUDA_OLD_DRIVER it is a CUDA 11.8 driver instead: no
// cuTensorMapEncodeTiled and no cuLaunchKernelEx at all (tests/runtime/TensorMapOldDriverTest.cpp).
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <mutex>
#include <string>

namespace {

constexpr int kInvalidValue = 1, kInvalidImage = 200, kNotFound = 500;

std::mutex gMutex;

void record(const std::string& line) {
  std::lock_guard lock(gMutex);
  const char* path = std::getenv("FLEXTILE_FAKE_CUDA_LOG");
  if (!path || !*path) return;
  if (std::FILE* f = std::fopen(path, "a")) {
    std::fprintf(f, "%s\n", line.c_str());
    std::fclose(f);
  }
}

std::string streamText(void* stream) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%p", stream);
  return stream ? buf : "0";
}

void* addressOf(uint64_t p) { return reinterpret_cast<void*>(static_cast<uintptr_t>(p)); }

struct Function {
  std::string name;
};
struct LinkState {
  std::string image;
};

int gStreams = 0;

// Stream capture (thread-local, as FlexTile asks for): the stream being captured by this thread,
// the launches and copies recorded into its graph, and whether a call the capture cannot hold (a
// synchronous copy, memset or wait) broke it, as the driver's CUDA_ERROR_STREAM_CAPTURE_UNSUPPORTED
// does.
constexpr int kCaptureUnsupported = 900, kCaptureInvalidated = 901;
thread_local void* gCapturing = nullptr;
thread_local int gCapturedNodes = 0;
thread_local bool gCaptureBroken = false;

// A synchronous call during a capture: refused, and the capture is broken.
bool refusedInCapture(const char* what) {
  if (!gCapturing) return false;
  gCaptureBroken = true;
  record(std::string("refused ") + what + " during a capture");
  return true;
}

// " (captured)" for work queued on the stream being captured, which a graph now holds instead.
std::string capturedNote(void* stream) {
  if (!gCapturing || stream != gCapturing) return "";
  ++gCapturedNodes;
  return " (captured)";
}

struct FakeGraph {
  int nodes;
};

}  // namespace

extern "C" {

int cuInit(unsigned) { return 0; }
int cuDriverGetVersion(int* version) {
#ifdef FLEXTILE_FAKE_CUDA_OLD_DRIVER
  *version = 11080;
#else
  *version = 12080;
#endif
  return 0;
}
int cuDeviceGetCount(int* count) {
  *count = 1;
  return 0;
}
int cuGetErrorName(int, const char** name) {
  *name = "CUDA_ERROR_FAKE";
  return 0;
}
int cuGetErrorString(int, const char** description) {
  *description = "reported by the recording fake driver";
  return 0;
}
int cuDeviceGet(int* device, int ordinal) {
  if (ordinal != 0) return 101;
  *device = 0;
  return 0;
}
int cuDeviceGetName(char* name, int length, int) {
  std::snprintf(name, size_t(length), "Fake GPU");
  return 0;
}
int cuDeviceGetAttribute(int* value, int attribute, int) {
  switch (attribute) {
    case 1: *value = 1024; break;                          // max threads per block
    case 2: *value = 1024; break;                          // max block dim x
    case 5: *value = 2147483647; break;                    // max grid x
    case 6: case 7: *value = 65535; break;                 // max grid y, z
    case 8: *value = 48 * 1024; break;                     // shared per block
    case 10: *value = 32; break;                           // warp size
    case 13: *value = 1980000; break;                      // clock
    case 16: *value = 132; break;                          // SMs
    case 36: *value = 2619000; break;                      // memory clock
    case 37: *value = 6144; break;                         // bus width
    case 38: *value = 60 * 1024 * 1024; break;             // L2
    case 75: *value = 9; break;                            // capability major
    case 76: *value = 0; break;                            // capability minor
    case 81: *value = 228 * 1024; break;                   // shared per SM
    case 97: *value = 227 * 1024; break;                   // shared per block, opt-in
    default: *value = 0; break;
  }
  return 0;
}
int cuDeviceTotalMem_v2(size_t* bytes, int) {
  *bytes = size_t(1) << 34;
  return 0;
}
int cuDevicePrimaryCtxRetain(void** context, int) {
  static int fakeContext;
  *context = &fakeContext;
  return 0;
}
int cuCtxSetCurrent(void*) { return 0; }
int cuCtxSynchronize() { return refusedInCapture("cuCtxSynchronize") ? kCaptureUnsupported : 0; }
int cuMemGetInfo_v2(size_t* freeBytes, size_t* totalBytes) {
  *freeBytes = *totalBytes = size_t(1) << 34;
  return 0;
}
int cuMemAlloc_v2(uint64_t* pointer, size_t bytes) {
  // An allocation or free would make the graph hold memory whose life it does not control (and a
  // free synchronizes): refused inside a capture, as the driver's unsafe calls are.
  if (refusedInCapture("cuMemAlloc_v2")) return kCaptureUnsupported;
  void* p = std::aligned_alloc(256, (bytes + 255) / 256 * 256);
  if (!p) return 2;
  *pointer = reinterpret_cast<uintptr_t>(p);
  record("alloc " + streamText(p) + " " + std::to_string(bytes));
  return 0;
}
int cuMemFree_v2(uint64_t pointer) {
  if (refusedInCapture("cuMemFree_v2")) return kCaptureUnsupported;
  record("free " + streamText(addressOf(pointer)));
  std::free(addressOf(pointer));
  return 0;
}
int cuMemcpyHtoD_v2(uint64_t to, const void* from, size_t bytes) {
  if (refusedInCapture("cuMemcpyHtoD_v2")) return kCaptureUnsupported;
  std::memcpy(addressOf(to), from, bytes);
  record("htod " + std::to_string(bytes) + " stream sync");
  return 0;
}
int cuMemcpyDtoH_v2(void* to, uint64_t from, size_t bytes) {
  if (refusedInCapture("cuMemcpyDtoH_v2")) return kCaptureUnsupported;
  std::memcpy(to, addressOf(from), bytes);
  record("dtoh " + std::to_string(bytes) + " stream sync");
  return 0;
}
int cuMemcpyDtoD_v2(uint64_t to, uint64_t from, size_t bytes) {
  if (refusedInCapture("cuMemcpyDtoD_v2")) return kCaptureUnsupported;
  std::memmove(addressOf(to), addressOf(from), bytes);
  record("dtod " + std::to_string(bytes) + " stream sync");
  return 0;
}
int cuMemsetD8_v2(uint64_t to, unsigned char value, size_t bytes) {
  if (refusedInCapture("cuMemsetD8_v2")) return kCaptureUnsupported;
  std::memset(addressOf(to), value, bytes);
  record("memset " + std::to_string(bytes) + " stream sync");
  return 0;
}
int cuMemcpyHtoDAsync_v2(uint64_t to, const void* from, size_t bytes, void* stream) {
  // From pageable host memory, as FlexTile's uploads are: a graph cannot hold it.
  if (stream == gCapturing && refusedInCapture("cuMemcpyHtoDAsync_v2")) return kCaptureUnsupported;
  std::memcpy(addressOf(to), from, bytes);
  record("htod " + std::to_string(bytes) + " stream " + streamText(stream));
  return 0;
}
int cuMemcpyDtoHAsync_v2(void* to, uint64_t from, size_t bytes, void* stream) {
  if (stream == gCapturing && refusedInCapture("cuMemcpyDtoHAsync_v2")) return kCaptureUnsupported;
  std::memcpy(to, addressOf(from), bytes);
  record("dtoh " + std::to_string(bytes) + " stream " + streamText(stream));
  return 0;
}
int cuMemsetD8Async(uint64_t to, unsigned char value, size_t bytes, void* stream) {
  std::memset(addressOf(to), value, bytes);
  record("memset " + std::to_string(bytes) + " stream " + streamText(stream) + capturedNote(stream));
  return 0;
}

int cuLinkCreate_v2(unsigned, void*, void**, void** state) {
  *state = new LinkState;
  return 0;
}
int cuLinkAddData_v2(void* state, int type, void* data, size_t size, const char*, unsigned, void*, void**) {
  if (type != 1 || !data || size == 0) return kInvalidValue;
  if (const char* fail = std::getenv("FLEXTILE_FAKE_CUDA_LINK_FAILS"); fail && *fail == '1') {
    record("link fails");
    return kInvalidImage;
  }
  static_cast<LinkState*>(state)->image = "FAKECUBIN " + std::to_string(std::strlen(static_cast<const char*>(data)));
  record("link " + std::to_string(std::strlen(static_cast<const char*>(data))));
  return 0;
}
int cuLinkComplete(void* state, void** cubin, size_t* size) {
  auto* s = static_cast<LinkState*>(state);
  *cubin = s->image.data();
  *size = s->image.size();
  return 0;
}
int cuLinkDestroy(void* state) {
  delete static_cast<LinkState*>(state);
  return 0;
}

int cuModuleLoadDataEx(void** module, const void* image, unsigned, void*, void**) {
  const char* text = static_cast<const char*>(image);
  if (std::strncmp(text, "FAKECUBIN ", 10) == 0) {
    record("load cubin");
  } else if (std::strstr(text, ".entry") != nullptr) {
    record("load ptx");
  } else {
    record("refuse image");
    return kInvalidImage;
  }
  static int fakeModule;
  *module = &fakeModule;
  return 0;
}
int cuModuleGetFunction(void** function, void*, const char* name) {
  if (!name || !*name) return kNotFound;
  // One per lookup, owned here until exit (as a real driver owns them until the module goes), so
  // LeakSanitizer sees them reachable.
  static std::deque<Function> functions;
  static std::mutex mutex;
  std::lock_guard lock(mutex);
  *function = &functions.emplace_back(Function{name});
  return 0;
}
int cuModuleUnload(void*) { return 0; }
int cuFuncGetAttribute(int* value, int attribute, void*) {
  switch (attribute) {
    case 0: *value = 1024; break;  // max threads per block
    case 4: *value = 32; break;    // registers
    case 5: *value = 80; break;    // PTX version
    case 6: *value = 90; break;    // binary version
    case 8: *value = 48 * 1024; break;
    default: *value = 0; break;
  }
  return 0;
}
int cuFuncSetAttribute(void*, int, int) { return 0; }
int cuLaunchKernel(void* function, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, void* stream,
                   void**, void**) {
  record("launch " + static_cast<Function*>(function)->name + " stream " + streamText(stream) + capturedNote(stream));
  return 0;
}

int cuStreamCreate(void** stream, unsigned) {
  *stream = reinterpret_cast<void*>(static_cast<uintptr_t>(0x1000 + 0x10 * ++gStreams));
  return 0;
}
int cuStreamSynchronize(void*) { return refusedInCapture("cuStreamSynchronize") ? kCaptureUnsupported : 0; }
int cuStreamDestroy_v2(void* stream) {
  record("destroy stream " + streamText(stream));
  return 0;
}
int cuEventCreate(void** event, unsigned) {
  static int fakeEvent;
  *event = &fakeEvent;
  return 0;
}
int cuEventRecord(void*, void*) { return 0; }
int cuEventSynchronize(void*) { return 0; }
int cuEventElapsedTime(float* ms, void*, void*) {
  *ms = 0;
  return 0;
}
int cuEventDestroy_v2(void*) { return 0; }

#ifndef FLEXTILE_FAKE_CUDA_OLD_DRIVER
// cuda.h's launch configuration, written out here as the header has it (not shared with
// runtime/DriverApi.h, so that a layout mistake there shows as wrong numbers in the log).
struct CUlaunchAttribute {
  int id;
  char pad[8 - sizeof(int)];
  union {
    char pad[64];
    int programmaticStreamSerializationAllowed;
    void* alignment;
  } value;
};
struct CUlaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  void* hStream;
  CUlaunchAttribute* attrs;
  unsigned numAttrs;
};
// Logs "launchex <kernel> stream <s> grid X,Y,Z block X,Y,Z smem <bytes> attrs <id>=<int value>,..."
int cuLaunchKernelEx(const CUlaunchConfig* config, void* function, void**, void**) {
  std::string attrs;
  for (unsigned i = 0; i < config->numAttrs; ++i)
    attrs += (i ? "," : "") + std::to_string(config->attrs[i].id) + "=" +
             std::to_string(config->attrs[i].value.programmaticStreamSerializationAllowed);
  record("launchex " + static_cast<Function*>(function)->name + " stream " + streamText(config->hStream) + " grid " +
         std::to_string(config->gridDimX) + "," + std::to_string(config->gridDimY) + "," +
         std::to_string(config->gridDimZ) + " block " + std::to_string(config->blockDimX) + "," +
         std::to_string(config->blockDimY) + "," + std::to_string(config->blockDimZ) + " smem " +
         std::to_string(config->sharedMemBytes) + " attrs " + attrs + capturedNote(config->hStream));
  return 0;
}

// Stream capture and graph replay. Logs "begin capture stream <s>", "end capture stream <s>
// nodes <n>" (or "capture broken"), "instantiate nodes <n>", "graph launch stream <s> nodes <n>".
int cuStreamBeginCapture_v2(void* stream, int mode) {
  if (gCapturing || !stream || mode != 1) return kInvalidValue;  // FlexTile captures thread-locally
  gCapturing = stream, gCapturedNodes = 0, gCaptureBroken = false;
  record("begin capture stream " + streamText(stream));
  return 0;
}
int cuStreamEndCapture(void* stream, void** graph) {
  if (stream != gCapturing) return kInvalidValue;
  gCapturing = nullptr;
  *graph = nullptr;
  if (gCaptureBroken) {
    record("end capture stream " + streamText(stream) + ": capture broken");
    return kCaptureInvalidated;
  }
  record("end capture stream " + streamText(stream) + " nodes " + std::to_string(gCapturedNodes));
  *graph = new FakeGraph{gCapturedNodes};
  return 0;
}
int cuGraphInstantiateWithFlags(void** exec, void* graph, unsigned long long) {
  *exec = new FakeGraph{static_cast<FakeGraph*>(graph)->nodes};
  record("instantiate nodes " + std::to_string(static_cast<FakeGraph*>(graph)->nodes));
  return 0;
}
int cuGraphLaunch(void* exec, void* stream) {
  record("graph launch stream " + streamText(stream) + " nodes " + std::to_string(static_cast<FakeGraph*>(exec)->nodes));
  return 0;
}
int cuGraphExecDestroy(void* exec) {
  delete static_cast<FakeGraph*>(exec);
  return 0;
}
int cuGraphDestroy(void* graph) {
  delete static_cast<FakeGraph*>(graph);
  record("destroy graph");
  return 0;
}

int cuTensorMapEncodeTiled(void* tensorMap, int dataType, uint32_t rank, void* globalAddress, const uint64_t* globalDim,
                           const uint64_t* globalStrides, const uint32_t* boxDim, const uint32_t* elementStrides,
                           int interleave, int swizzle, int l2Promotion, int oobFill) {
  auto join = [&](auto* values, uint32_t n) {
    std::string out;
    for (uint32_t i = 0; i < n; ++i) out += (i ? "," : "") + std::to_string(values[i]);
    return out;
  };
  record("tensormap dtype " + std::to_string(dataType) + " rank " + std::to_string(rank) + " address " +
         streamText(globalAddress) + " dims " + join(globalDim, rank) + " strides " +
         join(globalStrides, rank ? rank - 1 : 0) + " box " + join(boxDim, rank) + " elementstrides " +
         join(elementStrides, rank) + " interleave " + std::to_string(interleave) + " swizzle " +
         std::to_string(swizzle) + " l2 " + std::to_string(l2Promotion) + " oobfill " + std::to_string(oobFill));
  if (reinterpret_cast<uintptr_t>(tensorMap) % 64 != 0) return kInvalidValue;
  if (const char* fail = std::getenv("FLEXTILE_FAKE_CUDA_TENSOR_MAP_FAILS"); fail && *fail == '1') return kInvalidValue;
  auto* words = static_cast<uint64_t*>(tensorMap);
  for (uint64_t i = 0; i < 16; ++i) words[i] = 0x7E45000000000000ull + i + 1;
  return 0;
}
#endif

}  // extern "C"
