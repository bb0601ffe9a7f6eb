// Counting the CUDA work a process enqueues (cuda_ops.h cuda_api_counting): CUPTI's driver-API callbacks, which see
// every kernel launch, copy and set, the runtime's and cuBLAS's included. Without CUPTI (FLASHNEXT_HAVE_CUPTI
// undefined) counting is unavailable and cuda_api_counting returns false.
#include <atomic>

#include "ops/cuda/cuda_ops.h"

#ifdef FLASHNEXT_HAVE_CUPTI
#include <cupti.h>

#include <cstring>
#endif

namespace flashnext {

namespace {
std::atomic<int64_t> g_launches{0}, g_memcpys{0}, g_memsets{0};

#ifdef FLASHNEXT_HAVE_CUPTI
CUpti_SubscriberHandle g_subscriber = nullptr;

void CUPTIAPI on_driver_call(void*, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
  if (domain != CUPTI_CB_DOMAIN_DRIVER_API) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER || !info->functionName) return;
  const char* f = info->functionName;
  if (std::strstr(f, "LaunchKernel") || std::strstr(f, "LaunchCooperativeKernel"))
    ++g_launches;
  else if (std::strncmp(f, "cuMemcpy", 8) == 0)
    ++g_memcpys;
  else if (std::strncmp(f, "cuMemset", 8) == 0)
    ++g_memsets;
}
#endif
}  // namespace

bool cuda_api_counting(bool on) {
#ifdef FLASHNEXT_HAVE_CUPTI
  if (on) {
    g_launches = g_memcpys = g_memsets = 0;
    if (!g_subscriber) {
      if (cuptiSubscribe(&g_subscriber, reinterpret_cast<CUpti_CallbackFunc>(on_driver_call), nullptr) !=
          CUPTI_SUCCESS) {
        g_subscriber = nullptr;
        return false;
      }
    }
    return cuptiEnableDomain(1, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API) == CUPTI_SUCCESS;
  }
  if (g_subscriber) cuptiEnableDomain(0, g_subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
  return true;
#else
  (void)on;
  return false;
#endif
}

CudaApiCounts cuda_api_counts() {
  return {g_launches.load(), g_memcpys.load(), g_memsets.load()};
}

}  // namespace flashnext
