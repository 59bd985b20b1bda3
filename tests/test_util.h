// Helpers shared by every test binary: a temporary folder, whole-file I/O, running a program.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <random>
#include <string>
#include <vector>

#include "core/error.h"

namespace sf::test {

// The message of the sf::Error that `f` throws, or "(no error)".
inline std::string error_of(const std::function<void()>& f) {
    try {
        f();
    } catch (const sf::Error& e) {
        return e.what();
    }
    return "(no error)";
}

// `f` must throw an sf::Error of kInvalidArgument whose message contains each of `needles`.
inline void expect_invalid(const std::function<void()>& f,
                           const std::vector<std::string>& needles) {
    try {
        f();
        ADD_FAILURE() << "no error";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), sf::ErrorCode::kInvalidArgument) << e.what();
        for (const auto& n : needles) {
            EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
                << "'" << n << "' not in: " << e.what();
        }
    }
}

// `f` must throw an sf::Error of `code` whose message contains `text`.
inline void expect_error(const std::function<void()>& f, sf::ErrorCode code,
                         const std::string& text) {
    try {
        f();
        ADD_FAILURE() << "no exception; expected one containing \"" << text << "\"";
    } catch (const sf::Error& e) {
        EXPECT_EQ(e.code(), code) << e.what();
        EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
}

// A fresh folder under the system temp dir, removed with everything in it on destruction.
class TempDir {
public:
    explicit TempDir(const std::string& prefix = "sf_test") {
        std::string pattern =
            (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
        if (::mkdtemp(pattern.data()) == nullptr) std::abort();
        path_ = pattern;
    }
    ~TempDir() {
        std::error_code ec;
        std::filesystem::remove_all(path_, ec);
    }
    TempDir(const TempDir&) = delete;
    TempDir& operator=(const TempDir&) = delete;

    const std::filesystem::path& path() const { return path_; }
    std::string file(const std::string& name) const { return (path_ / name).string(); }

private:
    std::filesystem::path path_;
};

inline void write_file(const std::filesystem::path& path, const std::string& bytes) {
    std::filesystem::create_directories(path.parent_path());
    std::ofstream out(path, std::ios::binary);
    out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
    ASSERT_TRUE(out.good()) << path;
}

// Whether a listening socket could bind `port` on the loopback now.
inline bool port_is_free(int port) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    a.sin_port = htons(static_cast<std::uint16_t>(port));
    const bool free = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) == 0;
    ::close(fd);
    return free;
}

// A port nothing listens on now, with the one above it free too (under torchrun a 1.13 build
// hosts its store at MASTER_PORT + 1). Drawn below the kernel's ephemeral range, so no outgoing
// connection of another test takes it between this check and the bind.
inline int free_port() {
    int low = 32768, high = 60999;
    std::ifstream("/proc/sys/net/ipv4/ip_local_port_range") >> low >> high;
    const int top = std::max(low, 2048) - 2;
    std::mt19937 draw(std::random_device{}());
    std::uniform_int_distribution<int> pick(std::min(1024, top), top);
    for (int attempt = 0; attempt < 1000; ++attempt) {
        const int port = pick(draw);
        if (port_is_free(port) && port_is_free(port + 1)) return port;
    }
    ADD_FAILURE() << "no free pair of ports below " << low;
    return 0;
}

inline std::string read_file(const std::filesystem::path& path) {
    std::ifstream in(path, std::ios::binary);
    return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

struct CommandResult {
    int exit_code = -1;
    std::string output;  // stdout and stderr together
};

// Runs `command` through the shell with no standard input, as CI does.
inline CommandResult run_command(const std::string& command) {
    CommandResult result;
    FILE* pipe = ::popen((command + " </dev/null 2>&1").c_str(), "r");
    if (pipe == nullptr) return result;
    std::array<char, 4096> buf;
    size_t n;
    while ((n = std::fread(buf.data(), 1, buf.size(), pipe)) > 0)
        result.output.append(buf.data(), n);
    const int status = ::pclose(pipe);
    result.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : -1;
    return result;
}

}  // namespace sf::test
