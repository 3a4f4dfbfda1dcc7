// libopsfuse_trt.so's entry points.
//  * Static registration: loading the library (ctypes.CDLL, trtexec --staticPlugins, Polygraphy
//    --plugins) registers the FusedAttention creator in TensorRT's global plugin registry.
//  * getCreators / setLoggerFinder: the entry points IPluginRegistry::loadLibrary calls
//    (trt.get_plugin_registry().load_library, trtexec --dynamicPlugins, plugins serialized into
//    an engine). loadLibrary registers what getCreators returns and fails when a creator is
//    already registered, so getCreators first withdraws the static registration.
// These two functions are the only symbols the library exports (exports.map).
#include <cstdint>
#include <exception>
#include <mutex>
#include <string>

#include "NvInferRuntime.h"
#include "common/contract.h"
#include "fused_attention_creator.h"
#include "trt_runtime.h"

#define OPSFUSE_TRT_EXPORT extern "C" __attribute__((visibility("default")))

namespace opsfuse::trt {
namespace {

FusedAttentionCreator& the_creator() {
  static FusedAttentionCreator creator;
  return creator;
}

std::mutex g_mutex;
nvinfer1::IPluginRegistry* g_static_registry = nullptr;  // where the load-time registration went

struct StaticRegistration {
  StaticRegistration() noexcept {
    try {
      std::string why;
      nvinfer1::IPluginRegistry* registry = plugin_registry(&why);
      if (registry == nullptr) {
        log_warning(std::string("libopsfuse_trt.so: ") + contract::kOpName +
                    " creator not registered at load: " + why +
                    ". Load TensorRT first, or register through IPluginRegistry::loadLibrary.");
        return;
      }
      std::lock_guard<std::mutex> lock(g_mutex);
      if (registry->registerCreator(the_creator(), contract::kTrtPluginNamespace)) {
        g_static_registry = registry;
      } else {
        log_warning(std::string("libopsfuse_trt.so: TensorRT refused to register ") + contract::kOpName +
                    " version " + contract::kTrtPluginVersion + " in namespace '" + contract::kTrtPluginNamespace +
                    "' (already registered?)");
      }
    } catch (...) {
      // Never let an exception escape a library constructor.
    }
  }
};

const StaticRegistration g_static_registration;

}  // namespace
}  // namespace opsfuse::trt

OPSFUSE_TRT_EXPORT void setLoggerFinder(nvinfer1::ILoggerFinder* finder) {
  opsfuse::trt::set_logger_finder(finder);
}

OPSFUSE_TRT_EXPORT nvinfer1::IPluginCreatorInterface* const* getCreators(int32_t& nbCreators) {
  using namespace opsfuse::trt;
  static nvinfer1::IPluginCreatorInterface* creators[1] = {nullptr};
  try {
    creators[0] = &the_creator();
    std::lock_guard<std::mutex> lock(g_mutex);
    if (g_static_registry != nullptr) {
      g_static_registry->deregisterCreator(the_creator());
      g_static_registry = nullptr;
    }
    nbCreators = 1;
    return creators;
  } catch (...) {
    nbCreators = 0;
    return nullptr;
  }
}
