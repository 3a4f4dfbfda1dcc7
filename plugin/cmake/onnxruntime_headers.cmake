# Finds the ONNX Runtime C/C++ headers (no wheel ships them). Order: ONNXRUNTIME_ROOT (cache or
# environment), a system install, then the copy that scripts/fetch_ort_headers.sh unpacks from
# Debian's libonnxruntime-dev into <source>/.deps (run here when nothing else is found, so a
# fresh machine builds with one command). Sets OPSFUSE_ORT_INCLUDE_DIR.
set(_ort_hints "")
if(ONNXRUNTIME_ROOT)
  list(APPEND _ort_hints "${ONNXRUNTIME_ROOT}")
endif()
if(DEFINED ENV{ONNXRUNTIME_ROOT} AND NOT "$ENV{ONNXRUNTIME_ROOT}" STREQUAL "")
  list(APPEND _ort_hints "$ENV{ONNXRUNTIME_ROOT}")
endif()
set(_ort_fetched "${PROJECT_SOURCE_DIR}/.deps/onnxruntime/usr")
set(_ort_suffixes include include/onnxruntime include/onnxruntime/core/session)

function(_opsfuse_find_ort_headers out)
  find_path(_ort_inc onnxruntime_c_api.h
    HINTS ${ARGN}
    PATH_SUFFIXES ${_ort_suffixes}
    NO_CACHE)
  set(${out} "${_ort_inc}" PARENT_SCOPE)
endfunction()

_opsfuse_find_ort_headers(OPSFUSE_ORT_INCLUDE_DIR ${_ort_hints} /usr /usr/local ${_ort_fetched})
if(NOT OPSFUSE_ORT_INCLUDE_DIR)
  message(STATUS "opsfuse: no ONNX Runtime headers in ONNXRUNTIME_ROOT='${ONNXRUNTIME_ROOT}', "
                 "/usr, /usr/local or ${_ort_fetched}; fetching Debian's libonnxruntime-dev")
  execute_process(
    COMMAND bash "${PROJECT_SOURCE_DIR}/scripts/fetch_ort_headers.sh" "${PROJECT_SOURCE_DIR}/.deps/onnxruntime"
    RESULT_VARIABLE _fetch_rc)
  if(_fetch_rc EQUAL 0)
    _opsfuse_find_ort_headers(OPSFUSE_ORT_INCLUDE_DIR ${_ort_fetched})
  endif()
endif()
if(NOT OPSFUSE_ORT_INCLUDE_DIR)
  message(FATAL_ERROR
    "opsfuse: ONNX Runtime C/C++ headers (onnxruntime_c_api.h, onnxruntime_cxx_api.h) not found.\n"
    "Looked in: ONNXRUNTIME_ROOT='${ONNXRUNTIME_ROOT}' (cache or environment), /usr/include, "
    "/usr/local/include (also under onnxruntime/), and ${_ort_fetched}/include/onnxruntime.\n"
    "Fix: set ONNXRUNTIME_ROOT to an ONNX Runtime install prefix, or run "
    "scripts/fetch_ort_headers.sh (needs apt-get and network access to Debian's archive).")
endif()
message(STATUS "opsfuse: ONNX Runtime headers: ${OPSFUSE_ORT_INCLUDE_DIR}")
