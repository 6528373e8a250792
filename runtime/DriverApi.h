// The slice of the CUDA Driver API that FlexTile uses, declared here by hand.
//
// FlexTile never includes cuda.h nor links libcuda: the library must build and run
// (trace, compile to PTX, interpret) on machines without the NVIDIA driver. So the few
// types, enum values and prototypes we need are restated below, with the numbers that
// the CUDA documentation gives them, and every entry point is resolved at run time with
// dlsym on libcuda.so.1 (see Driver.cpp).
//
// Symbol names: cuda.h maps several functions to versioned symbols with macros
// (cuMemAlloc -> cuMemAlloc_v2, ...). Plain dlsym sees only the real exported names, so
// the table below names the versioned symbol wherever one exists. We use dlsym rather than
// cuGetProcAddress_v2 because dlsym needs no working driver to report a missing symbol,
// which keeps the "driver too old / not a driver" diagnosis plain.
//
// This header is internal to runtime/: the public classes expose handles as void*.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace flextile::runtime::cu {

using Result = int;          // CUresult
using DeviceOrdinal = int;   // CUdevice
using DevicePtr = uint64_t;  // CUdeviceptr (64-bit on every platform FlexTile supports)

// Opaque driver handles. Declared in our namespace so a translation unit that also
// includes cuda.h sees no clash.
using Context = struct Context_st*;    // CUcontext
using Module = struct Module_st*;      // CUmodule
using Function = struct Function_st*;  // CUfunction
using Stream = struct Stream_st*;      // CUstream
using Event = struct Event_st*;        // CUevent
using LinkState = struct LinkState_st*;  // CUlinkState
using Graph = struct Graph_st*;          // CUgraph
using GraphExec = struct GraphExec_st*;  // CUgraphExec

// CUresult values the runtime reasons about (the rest are named by cuGetErrorName).
inline constexpr Result kSuccess = 0;
inline constexpr Result kErrorInvalidValue = 1;
inline constexpr Result kErrorOutOfMemory = 2;
inline constexpr Result kErrorNotInitialized = 3;
inline constexpr Result kErrorDeinitialized = 4;
inline constexpr Result kErrorNoDevice = 100;
inline constexpr Result kErrorInvalidDevice = 101;

// CUdevice_attribute
enum DeviceAttribute : int {
  kAttrMaxThreadsPerBlock = 1,
  kAttrMaxBlockDimX = 2,
  kAttrMaxGridDimX = 5,
  kAttrMaxGridDimY = 6,
  kAttrMaxGridDimZ = 7,
  kAttrMaxSharedMemoryPerBlock = 8,
  kAttrWarpSize = 10,
  kAttrClockRate = 13,  // kHz
  kAttrMultiprocessorCount = 16,
  kAttrMemoryClockRate = 36,  // kHz
  kAttrGlobalMemoryBusWidth = 37,
  kAttrL2CacheSize = 38,
  kAttrComputeCapabilityMajor = 75,
  kAttrComputeCapabilityMinor = 76,
  kAttrMaxSharedMemoryPerMultiprocessor = 81,
  kAttrMaxSharedMemoryPerBlockOptin = 97,
};

// CUfunction_attribute
enum FunctionAttribute : int {
  kFuncMaxThreadsPerBlock = 0,
  kFuncSharedSizeBytes = 1,  // static shared memory
  kFuncConstSizeBytes = 2,
  kFuncLocalSizeBytes = 3,  // local memory per thread (spills, stack)
  kFuncNumRegs = 4,
  kFuncPtxVersion = 5,
  kFuncBinaryVersion = 6,
  kFuncMaxDynamicSharedSizeBytes = 8,
};

// CUjit_option
enum JitOption : int {
  kJitWallTime = 2,  // out: float milliseconds
  kJitInfoLogBuffer = 3,
  kJitInfoLogBufferSizeBytes = 4,  // in: capacity, out: bytes written
  kJitErrorLogBuffer = 5,
  kJitErrorLogBufferSizeBytes = 6,
  kJitLogVerbose = 12,
};

// CUjitInputType
inline constexpr int kJitInputPtx = 1;  // CU_JIT_INPUT_PTX

inline constexpr unsigned kStreamDefault = 0x0;    // CU_STREAM_DEFAULT
inline constexpr unsigned kStreamNonBlocking = 0x1;  // CU_STREAM_NON_BLOCKING
// CUstreamCaptureMode: thread-local, so that another thread's unrelated calls neither break a
// capture nor are refused because of it.
inline constexpr int kStreamCaptureModeThreadLocal = 1;  // CU_STREAM_CAPTURE_MODE_THREAD_LOCAL
inline constexpr unsigned kEventDefault = 0x0;     // CU_EVENT_DEFAULT
inline constexpr unsigned kEventDisableTiming = 0x2;  // CU_EVENT_DISABLE_TIMING

// CUtensorMap: an opaque 128-byte descriptor (CU_TENSOR_MAP_NUM_QWORDS = 16) that the driver
// requires 64-byte aligned.
struct alignas(64) TensorMapWords {
  uint64_t words[16];
};
static_assert(sizeof(TensorMapWords) == 128);

// CUtensorMapDataType (the types FlexTile's kernels move; the driver has more).
enum TensorMapDataType : int {
  kTensorMapUInt8 = 0,
  kTensorMapUInt16 = 1,
  kTensorMapUInt32 = 2,
  kTensorMapInt32 = 3,
  kTensorMapUInt64 = 4,
  kTensorMapInt64 = 5,
  kTensorMapFloat16 = 6,
  kTensorMapFloat32 = 7,
  kTensorMapFloat64 = 8,
  kTensorMapBFloat16 = 9,
};
inline constexpr int kTensorMapInterleaveNone = 0;  // CU_TENSOR_MAP_INTERLEAVE_NONE
// CUtensorMapSwizzle
enum TensorMapSwizzleMode : int { kSwizzleNone = 0, kSwizzle32B = 1, kSwizzle64B = 2, kSwizzle128B = 3 };
// CUtensorMapL2promotion
enum TensorMapL2Promotion : int { kL2PromotionNone = 0, kL2Promotion64B = 1, kL2Promotion128B = 2, kL2Promotion256B = 3 };
inline constexpr int kTensorMapOobFillNone = 0;  // CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE: out-of-bounds reads give zeros

// cuLaunchKernelEx's configuration (cuda.h CUlaunchConfig and CUlaunchAttribute, same layout):
// the launch geometry and a list of attributes, each an id and a 64-byte value union.
enum LaunchAttributeId : int { kLaunchAttributeProgrammaticStreamSerialization = 6 };
struct LaunchAttribute {
  int id;
  char pad[4];
  alignas(8) unsigned char value[64];  // for id 6: an int, non-zero to allow the overlap
};
static_assert(sizeof(LaunchAttribute) == 72, "cuda.h's CUlaunchAttribute is 72 bytes");
struct LaunchConfig {
  unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
  Stream stream;
  LaunchAttribute* attrs;
  unsigned numAttrs;
};
static_assert(sizeof(LaunchConfig) == 56, "cuda.h's CUlaunchConfig is 56 bytes");

// The entry points, one pointer each, filled by Driver when libcuda loads.
struct Api {
  Result (*init)(unsigned flags);
  Result (*driverGetVersion)(int* version);
  Result (*getErrorName)(Result error, const char** name);
  Result (*getErrorString)(Result error, const char** description);

  Result (*deviceGetCount)(int* count);
  Result (*deviceGet)(DeviceOrdinal* device, int ordinal);
  Result (*deviceGetName)(char* name, int length, DeviceOrdinal device);
  Result (*deviceGetAttribute)(int* value, int attribute, DeviceOrdinal device);
  Result (*deviceTotalMem)(size_t* bytes, DeviceOrdinal device);  // _v2

  Result (*devicePrimaryCtxRetain)(Context* context, DeviceOrdinal device);
  Result (*ctxSetCurrent)(Context context);
  Result (*ctxSynchronize)();
  Result (*memGetInfo)(size_t* freeBytes, size_t* totalBytes);  // _v2

  Result (*memAlloc)(DevicePtr* pointer, size_t bytes);                              // _v2
  Result (*memFree)(DevicePtr pointer);                                              // _v2
  Result (*memcpyHtoD)(DevicePtr destination, const void* source, size_t bytes);     // _v2
  Result (*memcpyDtoH)(void* destination, DevicePtr source, size_t bytes);           // _v2
  Result (*memcpyDtoD)(DevicePtr destination, DevicePtr source, size_t bytes);       // _v2
  Result (*memsetD8)(DevicePtr destination, unsigned char value, size_t count);      // _v2
  // Stream-ordered forms, for work of a call given a stream. From or to pageable host memory the
  // driver stages the bytes: HtoD returns once the source may be reused, DtoH once the data is there.
  Result (*memcpyHtoDAsync)(DevicePtr destination, const void* source, size_t bytes, Stream stream);  // _v2
  Result (*memcpyDtoHAsync)(void* destination, DevicePtr source, size_t bytes, Stream stream);        // _v2
  Result (*memsetD8Async)(DevicePtr destination, unsigned char value, size_t count, Stream stream);

  Result (*moduleLoadDataEx)(Module* module, const void* image, unsigned numOptions, JitOption* options,
                             void** optionValues);
  // The JIT as a linker: the same PTX compile as moduleLoadDataEx, but it hands back the cubin it
  // made (owned by the link state until linkDestroy), which a later process loads without a JIT.
  Result (*linkCreate)(unsigned numOptions, JitOption* options, void** optionValues, LinkState* state);  // _v2
  Result (*linkAddData)(LinkState state, int type, void* data, size_t size, const char* name, unsigned numOptions,
                        JitOption* options, void** optionValues);  // _v2
  Result (*linkComplete)(LinkState state, void** cubin, size_t* size);
  Result (*linkDestroy)(LinkState state);
  Result (*moduleGetFunction)(Function* function, Module module, const char* name);
  Result (*moduleUnload)(Module module);
  Result (*funcGetAttribute)(int* value, int attribute, Function function);
  Result (*funcSetAttribute)(Function function, int attribute, int value);
  Result (*launchKernel)(Function function, unsigned gridX, unsigned gridY, unsigned gridZ, unsigned blockX,
                         unsigned blockY, unsigned blockZ, unsigned sharedBytes, Stream stream, void** params,
                         void** extra);

  Result (*streamCreate)(Stream* stream, unsigned flags);
  Result (*streamSynchronize)(Stream stream);
  Result (*streamDestroy)(Stream stream);  // _v2

  Result (*eventCreate)(Event* event, unsigned flags);
  Result (*eventRecord)(Event event, Stream stream);
  Result (*eventSynchronize)(Event event);
  Result (*eventElapsedTime)(float* milliseconds, Event start, Event stop);  // _v2 where exported
  Result (*eventDestroy)(Event event);                                        // _v2

  // Optional: null when the driver lacks it (it came with CUDA 12.0; everything else above is
  // older), so an old driver still runs every kernel that uses no tensor map. The enum arguments
  // are C enums, passed as int. Not versioned: cuda.h maps no other name to it.
  Result (*tensorMapEncodeTiled)(TensorMapWords* tensorMap, int dataType, uint32_t rank, void* globalAddress,
                                 const uint64_t* globalDim, const uint64_t* globalStrides, const uint32_t* boxDim,
                                 const uint32_t* elementStrides, int interleave, int swizzle, int l2Promotion,
                                 int oobFill);
  // Optional likewise (CUDA 12.0): a launch with attributes, here programmatic stream
  // serialization for kernels that wait for their prior grids themselves (griddepcontrol).
  Result (*launchKernelEx)(const LaunchConfig* config, Function function, void** params, void** extra);
  // Optional likewise (every CUDA 12 driver has them; a stand-in may not): stream capture into a
  // graph and its replay (runtime/Graph.h), which say what is missing when null.
  Result (*streamBeginCapture)(Stream stream, int mode);  // _v2
  Result (*streamEndCapture)(Stream stream, Graph* graph);
  Result (*graphInstantiate)(GraphExec* exec, Graph graph, unsigned long long flags);  // cuGraphInstantiateWithFlags
  Result (*graphLaunch)(GraphExec exec, Stream stream);
  Result (*graphExecDestroy)(GraphExec exec);
  Result (*graphDestroy)(Graph graph);
};

// The process-wide table; throws DriverError with the plain reason when no driver is usable.
const Api& api();

// Throws DriverError "<function> failed: NAME (description); <context>" unless result is success.
void check(Result result, const char* function);
void check(Result result, const char* function, const std::string& context);

// As check, but builds the context only on failure (for calls on hot paths).
template <class ContextFn>
void checkLazy(Result result, const char* function, ContextFn&& context) {
  if (result != kSuccess) check(result, function, context());
}

}  // namespace flextile::runtime::cu
