// Error-message building without iostreams: a std::string with operator<< for text and numbers,
// formatted by snprintf. The messages are built in the error paths of every front end; iostreams
// pull in the C++ locale machinery, which crashed (SIGSEGV in ostream::_M_insert<long>) when the
// pybind11 module formatted a number in a process that had imported PyTorch on the H200 image.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>
#include <type_traits>

namespace opsfuse {

class Message {
 public:
  Message& operator<<(const char* s) {
    text_ += s;
    return *this;
  }
  Message& operator<<(const std::string& s) {
    text_ += s;
    return *this;
  }
  Message& operator<<(char c) {
    text_ += c;
    return *this;
  }
  template <typename T, typename std::enable_if<std::is_integral<T>::value, int>::type = 0>
  Message& operator<<(T v) {
    char buf[32];
    if (std::is_signed<T>::value) {
      std::snprintf(buf, sizeof(buf), "%lld", static_cast<long long>(v));
    } else {
      std::snprintf(buf, sizeof(buf), "%llu", static_cast<unsigned long long>(v));
    }
    text_ += buf;
    return *this;
  }
  template <typename T, typename std::enable_if<std::is_floating_point<T>::value, int>::type = 0>
  Message& operator<<(T v) {
    char buf[48];
    std::snprintf(buf, sizeof(buf), "%g", static_cast<double>(v));  // as ostream's default format
    text_ += buf;
    return *this;
  }
  const std::string& str() const { return text_; }

 private:
  std::string text_;
};

}  // namespace opsfuse
