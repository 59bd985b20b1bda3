// The project's one error type. Libraries throw sf::Error; its category says what kind of
// failure it is, and its message names the file, key or flag at fault.
#pragma once

#include <stdexcept>
#include <string>

namespace sf {

enum class ErrorCode {
    kInvalidArgument,  // bad flag, bad config value, bad input data the caller can fix
    kNotFound,         // missing file, key, tensor
    kCorruption,       // checksum mismatch, truncated or malformed on-disk data
    kIOError,          // the operating system or a library failed (disk full, permission)
    kOutOfMemory,      // a byte budget or the device ran out
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
public:
    Error(ErrorCode code, const std::string& message)
        : std::runtime_error(std::string(error_code_name(code)) + ": " + message),
          code_(code),
          message_(message) {}

    ErrorCode code() const { return code_; }
    // The message without the category in front.
    const std::string& message() const { return message_; }

    static Error InvalidArgument(const std::string& m) { return {ErrorCode::kInvalidArgument, m}; }
    static Error NotFound(const std::string& m) { return {ErrorCode::kNotFound, m}; }
    static Error Corruption(const std::string& m) { return {ErrorCode::kCorruption, m}; }
    static Error IOError(const std::string& m) { return {ErrorCode::kIOError, m}; }
    static Error OutOfMemory(const std::string& m) { return {ErrorCode::kOutOfMemory, m}; }

private:
    ErrorCode code_;
    std::string message_;
};

// A bad input item (corrupt image, caption missing, too small): thrown by a stage for one item;
// the graph records the item's reason in the reject list, counts it and goes on. Any other
// exception escaping a stage is fatal and cancels the run.
class Reject : public Error {
public:
    explicit Reject(const std::string& reason)
        : Error(ErrorCode::kInvalidArgument, reason), reason_(reason) {}
    const std::string& reason() const { return reason_; }

private:
    std::string reason_;
};

inline const char* error_code_name(ErrorCode code) {
    switch (code) {
        case ErrorCode::kInvalidArgument:
            return "invalid argument";
        case ErrorCode::kNotFound:
            return "not found";
        case ErrorCode::kCorruption:
            return "corruption";
        case ErrorCode::kIOError:
            return "I/O error";
        case ErrorCode::kOutOfMemory:
            return "out of memory";
    }
    return "error";
}

}  // namespace sf
