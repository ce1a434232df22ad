// Typed errors that carry the place they were raised and the offending value. Library code throws;
// only cli/ turns an Error into a message and an exit code.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>
#include <utility>

namespace mt {

// Concatenates anything streamable into one string: mt::cat("shape ", s, " != ", t).
template <typename... Args>
std::string cat(Args&&... args) {
  std::ostringstream os;
  (os << ... << std::forward<Args>(args));
  return os.str();
}

class Error : public std::runtime_error {
 public:
  Error(const char* kind, const char* file, int line, const std::string& msg)
      : std::runtime_error(cat(kind, ": ", msg, " [", file, ":", line, "]")),
        message_(msg),
        file_(file),
        line_(line) {}
  const std::string& message() const { return message_; }
  const char* file() const { return file_; }
  int line() const { return line_; }

 private:
  std::string message_;
  const char* file_;
  int line_;
};

#define MT_DEFINE_ERROR(Name)                                                                   \
  class Name : public Error {                                                                   \
   public:                                                                                      \
    Name(const char* file, int line, const std::string& msg) : Error(#Name, file, line, msg) {} \
  }

MT_DEFINE_ERROR(ShapeError);     // tensor shapes or dtypes that do not fit together
MT_DEFINE_ERROR(ValueError);     // an argument out of its valid range
MT_DEFINE_ERROR(ConfigError);    // a malformed or unsupported configuration key
MT_DEFINE_ERROR(IoError);        // a file that cannot be read or written
MT_DEFINE_ERROR(MemoryError);    // an arena or allocation that cannot hold a request
MT_DEFINE_ERROR(InternalError);  // a broken invariant inside moetrain itself

#undef MT_DEFINE_ERROR

}  // namespace mt

// MT_THROW(ShapeError, "x has ", x.shape(), ", expected ", want);
#define MT_THROW(Type, ...) throw ::mt::Type(__FILE__, __LINE__, ::mt::cat(__VA_ARGS__))

// MT_CHECK(cond, ValueError, "top_k ", k, " exceeds experts ", e);
#define MT_CHECK(cond, Type, ...)             \
  do {                                        \
    if (!(cond)) MT_THROW(Type, __VA_ARGS__); \
  } while (0)
