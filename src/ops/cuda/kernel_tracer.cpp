// Kernel tracing through CUPTI's activity API (cuda_ops.h cuda_kernel_tracing): CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
// records, which keep kernels overlapping as they ran (programmatic dependent launch, branch streams) and cover the
// kernel nodes of replayed graphs. Without CUPTI (FLASHNEXT_HAVE_CUPTI undefined) tracing is unavailable and
// cuda_kernel_tracing returns false.
#include <mutex>
#include <unordered_map>

#include "ops/cuda/cuda_ops.h"

#ifdef FLASHNEXT_HAVE_CUPTI
#include <cupti.h>

#include <cstdlib>
#endif

namespace flashnext {

namespace {
std::mutex g_mutex;
std::vector<KernelInterval> g_trace;  // guarded by g_mutex

#ifdef FLASHNEXT_HAVE_CUPTI
constexpr size_t kBufferBytes = size_t(8) << 20, kBufferAlign = 8;
bool g_callbacks = false, g_on = false;
std::unordered_map<const char*, std::string> g_names;  // CUPTI's name pointers (shared by a kernel's records)

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(std::aligned_alloc(kBufferAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;  // as many as fit
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  {
    std::lock_guard<std::mutex> lock(g_mutex);
    CUpti_Activity* record = nullptr;
    while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) {
      if (record->kind != CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) continue;
      const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
      auto it = g_names.find(k->name);
      if (it == g_names.end()) it = g_names.emplace(k->name, short_kernel_name(k->name)).first;
      g_trace.push_back({it->second, k->start, k->end, k->deviceId, k->streamId, k->gridX, k->gridY, k->gridZ});
    }
  }
  std::free(buffer);
}
#endif
}  // namespace

bool cuda_kernel_tracing(bool on) {
#ifdef FLASHNEXT_HAVE_CUPTI
  if (on) {
    {
      std::lock_guard<std::mutex> lock(g_mutex);
      g_trace.clear();
    }
    if (!g_callbacks) {
      if (cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed) != CUPTI_SUCCESS) return false;
      g_callbacks = true;
    }
    g_on = cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) == CUPTI_SUCCESS;
    return g_on;
  }
  if (g_on) {
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    cuptiActivityDisable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
    cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
    g_on = false;
  }
  return true;
#else
  (void)on;
  return false;
#endif
}

std::vector<KernelInterval> cuda_kernel_trace() {
  std::lock_guard<std::mutex> lock(g_mutex);
  return g_trace;
}

}  // namespace flashnext
