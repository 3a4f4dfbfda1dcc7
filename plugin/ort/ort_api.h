// The ONNX Runtime C++ API with manual initialization: RegisterCustomOps hands us the OrtApi of
// the runtime that loaded the library (1.21 headers, any newer runtime).
#pragma once

#define ORT_API_MANUAL_INIT
#include <onnxruntime_cxx_api.h>
#undef ORT_API_MANUAL_INIT
