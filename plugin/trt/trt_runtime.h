// The few things the plugin needs from TensorRT's runtime library (libnvinfer) besides its
// headers: the global plugin registry and a logger. They are looked up when first needed in the
// libnvinfer already loaded into the process, never linked, so libopsfuse_trt.so has no undefined
// TensorRT symbols: it loads (and reports why it cannot register) in a process without TensorRT.
#pragma once

#include <string>

#include "NvInferRuntime.h"

namespace opsfuse::trt {

// Installed by setLoggerFinder() (IPluginRegistry::loadLibrary, --dynamicPlugins, plugins
// embedded in an engine); null until then.
void set_logger_finder(nvinfer1::ILoggerFinder* finder) noexcept;

// Reports through the logger of the TensorRT object that called the plugin (the logger finder),
// else TensorRT's global logger (getLogger()), else stderr. Never throws.
void log(nvinfer1::ILogger::Severity severity, const std::string& message) noexcept;
inline void log_error(const std::string& message) noexcept { log(nvinfer1::ILogger::Severity::kERROR, message); }
inline void log_warning(const std::string& message) noexcept {
  log(nvinfer1::ILogger::Severity::kWARNING, message);
}

// TensorRT's global plugin registry, from the libnvinfer loaded into this process (loading
// libnvinfer.so.<major> when none is). Null, with `why` set, when TensorRT is not available.
nvinfer1::IPluginRegistry* plugin_registry(std::string* why) noexcept;

}  // namespace opsfuse::trt
