#include "trt_runtime.h"

#include <dlfcn.h>

#include <atomic>
#include <cstdio>
#include <string>

namespace opsfuse::trt {
namespace {

std::atomic<nvinfer1::ILoggerFinder*> g_logger_finder{nullptr};

// Sonames of TensorRT's runtime library: the major version these headers belong to first.
#define OPSFUSE_STR2(x) #x
#define OPSFUSE_STR(x) OPSFUSE_STR2(x)
const char* const kNvinferNames[] = {
    "libnvinfer.so." OPSFUSE_STR(NV_TENSORRT_MAJOR),
    "libnvinfer.so.11",
    "libnvinfer.so.10",
    "libnvinfer.so",
};

// Looks `symbol` up in the process's global scope, then in any libnvinfer already loaded (Python
// extension modules load it with RTLD_LOCAL, out of the global scope); with `load`, finally loads
// libnvinfer itself. Returns null when none has it.
void* find_nvinfer_symbol(const char* symbol, bool load, std::string* why) {
  dlerror();
  if (void* sym = dlsym(RTLD_DEFAULT, symbol)) return sym;
  for (const char* name : kNvinferNames) {
    if (void* handle = dlopen(name, RTLD_LAZY | RTLD_NOLOAD)) {
      void* sym = dlsym(handle, symbol);
      dlclose(handle);  // drops only the reference RTLD_NOLOAD added
      if (sym) return sym;
    }
  }
  std::string last_error;
  if (load) {
    for (const char* name : kNvinferNames) {
      // Kept loaded for the life of the process: the registry it returns lives in it.
      if (void* handle = dlopen(name, RTLD_NOW | RTLD_GLOBAL)) {
        if (void* sym = dlsym(handle, symbol)) return sym;
      } else if (last_error.empty()) {
        const char* e = dlerror();
        last_error = e ? e : "";
      }
    }
  }
  if (why) {
    *why = std::string("TensorRT's runtime library (libnvinfer) is not loaded in this process") +
           (load ? " and could not be loaded" : "") + (last_error.empty() ? "" : " (" + last_error + ")");
  }
  return nullptr;
}

const char* severity_name(nvinfer1::ILogger::Severity s) {
  switch (s) {
    case nvinfer1::ILogger::Severity::kINTERNAL_ERROR: return "INTERNAL_ERROR";
    case nvinfer1::ILogger::Severity::kERROR: return "ERROR";
    case nvinfer1::ILogger::Severity::kWARNING: return "WARNING";
    case nvinfer1::ILogger::Severity::kINFO: return "INFO";
    case nvinfer1::ILogger::Severity::kVERBOSE: return "VERBOSE";
  }
  return "LOG";
}

}  // namespace

void set_logger_finder(nvinfer1::ILoggerFinder* finder) noexcept { g_logger_finder.store(finder); }

void log(nvinfer1::ILogger::Severity severity, const std::string& message) noexcept {
  try {
    nvinfer1::ILogger* logger = nullptr;
    if (nvinfer1::ILoggerFinder* finder = g_logger_finder.load()) logger = finder->findLogger();
    if (logger == nullptr) {
      using GetLogger = nvinfer1::ILogger* (*)();
      // Looked up on every message (errors only, so cheap enough): libnvinfer may be loaded later.
      const auto get_logger =
          reinterpret_cast<GetLogger>(find_nvinfer_symbol("getLogger", /*load=*/false, nullptr));
      if (get_logger) logger = get_logger();
    }
    if (logger != nullptr) {
      logger->log(severity, message.c_str());
      return;
    }
    if (severity <= nvinfer1::ILogger::Severity::kWARNING) {
      std::fprintf(stderr, "[opsfuse] %s: %s\n", severity_name(severity), message.c_str());
    }
  } catch (...) {
    // Logging must never take the process down.
  }
}

nvinfer1::IPluginRegistry* plugin_registry(std::string* why) noexcept {
  try {
    using GetRegistry = nvinfer1::IPluginRegistry* (*)();
    auto get_registry = reinterpret_cast<GetRegistry>(find_nvinfer_symbol("getPluginRegistry", /*load=*/true, why));
    if (get_registry == nullptr) return nullptr;
    nvinfer1::IPluginRegistry* registry = get_registry();
    if (registry == nullptr && why) *why = "getPluginRegistry() returned null";
    return registry;
  } catch (...) {
    if (why) *why = "looking up TensorRT's plugin registry failed";
    return nullptr;
  }
}

}  // namespace opsfuse::trt
